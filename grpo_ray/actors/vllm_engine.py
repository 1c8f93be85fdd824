"""The `vllm` rollout backend: vLLM's offline engine inside the rollout actor.

- The engine runs in the actor's own process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set by the actor
  launcher), so new weights are loaded in place through `collective_rpc("reload_weights")` with
  no engine restart and no copy through another process.
- `logprobs_mode="processed_logprobs"`: vLLM reports raw log-probs by default; we want those of the
  distribution the token was sampled from (temperature applied), as the learner computes them.
- Sampling seeds: request k gets seed + k * G, and vLLM gives its G children seed + 0..G-1, so no
  two completions of a step share a seed.
- LoRA (`lora` given): the engine serves the base model with vLLM's LoRA support, and each weight
  sync delivers only the adapter's matrices. They are written as a peft adapter folder and served
  as a new LoRARequest (vLLM keys loaded adapters by id, so each version gets a fresh id and the
  previous one is removed). Until the first sync, no adapter: peft starts lora_B at zero, so the
  base model is the learner's starting policy.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import numpy as np
import torch

from grpo_ray.types import Completion, SamplingSettings


class VllmEngine:
    def __init__(
        self,
        model_path: str,
        tokenizer,
        dtype: str = "float32",
        seed: int = 0,
        max_model_len: int = 1024,
        enforce_eager: bool = True,
        gpu_memory_utilization: float = 0.5,
        cpu_kv_cache_gb: float = 1.0,
        tensor_parallel_size: int = 1,
        config_overrides: dict | None = None,
        lora=None,
    ):
        from vllm import LLM

        self.tokenizer = tokenizer
        kwargs = dict(
            model=model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs",
            tensor_parallel_size=tensor_parallel_size,
        )
        if lora is not None:
            kwargs.update(enable_lora=True, max_lora_rank=lora.rank, max_loras=1)
        self.lora = lora
        self.lora_request = None
        self._adapters = tempfile.mkdtemp(prefix="grpo-ray-adapter-") if lora is not None else None
        if config_overrides:
            kwargs["hf_overrides"] = config_overrides  # e.g. YaRN rope scaling at evaluation time
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        else:
            kwargs["kv_cache_memory_bytes"] = int(cpu_kv_cache_gb * 2**30)
        self.llm = LLM(**kwargs)

    def generate(self, prompts: list[tuple[int, ...]], sampling: SamplingSettings) -> list[list[Completion]]:
        from vllm import SamplingParams

        greedy = sampling.temperature == 0
        requests = [{"prompt_token_ids": list(ids)} for ids in prompts]
        params = [
            SamplingParams(
                n=sampling.samples_per_prompt,
                temperature=sampling.temperature,
                top_p=1.0 if greedy else sampling.top_p,
                top_k=-1 if greedy else sampling.top_k,
                max_tokens=sampling.max_new_tokens,
                logprobs=0,  # the sampled token's own log-prob only
                seed=sampling.seed + k * sampling.samples_per_prompt,
            )
            for k in range(len(prompts))
        ]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self.lora_request)
        return [[self._completion(sample) for sample in output.outputs] for output in outputs]

    @staticmethod
    def _completion(sample) -> Completion:
        ids = tuple(sample.token_ids)
        logprobs = tuple(float(step[token].logprob) for step, token in zip(sample.logprobs, ids))
        return Completion(
            token_ids=ids,
            logprobs=logprobs,
            text=sample.text,
            finish_reason="length" if sample.finish_reason == "length" else "stop",
        )

    def score(self, input_ids: np.ndarray, attention_mask: np.ndarray, temperature: float) -> np.ndarray:
        """Log-probs [N, T] of given sequences, through vLLM's prompt log-probs (the weight-sync probe)."""
        from vllm import SamplingParams

        lengths = attention_mask.sum(axis=1)
        requests = [{"prompt_token_ids": input_ids[i, : lengths[i]].tolist()} for i in range(len(input_ids))]
        params = SamplingParams(max_tokens=1, temperature=temperature, prompt_logprobs=0)
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self.lora_request)
        result = np.zeros(input_ids.shape, dtype=np.float32)
        for i, output in enumerate(outputs):
            # prompt_logprobs[0] is None (the first token has no context).
            for t, entry in enumerate(output.prompt_logprobs[1:], start=1):
                result[i, t] = entry[int(input_ids[i, t])].logprob
        return result

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        if self.lora is not None:
            self._serve_adapter(weights)
        else:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})

    def bucket_storage(self, specs, buckets, device) -> None:
        """None: vLLM repacks weights as it loads them, so syncs go through load_weights."""
        return None

    def _serve_adapter(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        from peft import LoraConfig
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        previous = self.lora_request
        version = previous.lora_int_id + 1 if previous else 1
        folder = os.path.join(self._adapters, f"v{version}")
        # peft's parameter names carry the adapter's name ("lora_A.default.weight"); its files do not.
        tensors = {name.replace(".default.", "."): tensor.detach().cpu().contiguous() for name, tensor in weights}
        os.makedirs(folder)
        save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
        LoraConfig(r=self.lora.rank, lora_alpha=self.lora.alpha, target_modules=list(self.lora.target_modules),
                   task_type="CAUSAL_LM").save_pretrained(folder)
        self.lora_request = LoRARequest(f"policy-v{version}", version, folder)
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def __del__(self):
        if getattr(self, "_adapters", None):
            shutil.rmtree(self._adapters, ignore_errors=True)
