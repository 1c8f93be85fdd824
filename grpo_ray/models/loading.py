"""Load models and tokenizers (hub id, local folder, or the offline "tiny" model), LoRA, log-probs.

Shared by the learner, the reference actor and the hf rollout engine, so that all three compute
log-probs with the same function: any gap between them and the rollout engine is then the
engine's, not ours.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from grpo_ray.errors import ModelLoadError, first_line  # noqa: F401 (ModelLoadError: imported from here)
from grpo_ray.models.transformers_import import without_sklearn
from grpo_ray.types import WeightSpec

from grpo_ray.builtin_names import BUILT_IN_MODELS, GEMMA3, SMOLLM2, TINY, TINY_TEACHER, TINY_TOOLS  # noqa: F401 (BUILT_IN_MODELS: API)


def resolve_model_path(path: str) -> str:
    """ "tiny", "tiny-tools", "tiny-teacher", "smollm2-135m", "gemma3-270m" -> the cached offline model folder (built
    once); anything else unchanged."""
    if path == TINY:
        from grpo_ray.models.tiny import ensure_tiny_artifacts

        return str(ensure_tiny_artifacts().model_dir)
    if path == TINY_TOOLS:
        from grpo_ray.models.tiny_tools import ensure_tiny_tools_artifacts

        return str(ensure_tiny_tools_artifacts().model_dir)
    if path == TINY_TEACHER:
        from grpo_ray.models.tiny_teacher import ensure_tiny_teacher

        return str(ensure_tiny_teacher())
    if path == SMOLLM2:
        from grpo_ray.models.smollm2 import ensure_smollm2

        return str(ensure_smollm2())
    if path == GEMMA3:
        from grpo_ray.models.gemma3 import ensure_gemma3

        return str(ensure_gemma3())
    return path


def load_tokenizer(path: str):
    without_sklearn()
    from transformers import AutoTokenizer

    resolved = resolve_model_path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"tokenizer {path}: cannot load ({first_line(err)}); check the path or hub id") from None
    if tokenizer.pad_token_id is None:
        # Causal LMs often ship without a pad token; padding is masked out everywhere we pad.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def compute_device() -> torch.device:
    """The GPU this process was given (Ray sets CUDA_VISIBLE_DEVICES per actor), else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def load_causal_lm(
    path: str, dtype: str = "float32", config_overrides: dict | None = None, quantization: str | None = None
) -> torch.nn.Module:
    """The model at `path`; `config_overrides` are set on its config first (e.g. YaRN rope scaling).
    `quantization` ("4bit" | "8bit"): loaded through bitsandbytes, on this process's device and
    prepared for adapter training (models/quantization.py)."""
    without_sklearn()
    from transformers import AutoConfig, AutoModelForCausalLM

    resolved = resolve_model_path(path)
    try:
        kwargs = {}
        if quantization is not None:
            from grpo_ray.models.quantization import bitsandbytes_config

            # bitsandbytes quantises while loading, on the device the weights land on.
            kwargs.update(
                quantization_config=bitsandbytes_config(quantization, dtype), device_map={"": compute_device()}
            )
        if config_overrides:
            config = AutoConfig.from_pretrained(resolved)
            for name, value in config_overrides.items():
                setattr(config, name, value)
            kwargs["config"] = config
        model = AutoModelForCausalLM.from_pretrained(resolved, dtype=getattr(torch, dtype), **kwargs)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"model {path}: cannot load ({first_line(err)}); check model.path") from None
    if quantization is not None:
        from grpo_ray.models.quantization import prepare_for_adapter_training

        model = prepare_for_adapter_training(model)
    return model


def apply_lora(model: torch.nn.Module, rank: int, alpha: float, dropout: float, target_modules: tuple[str, ...]):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules), task_type="CAUSAL_LM"
    )
    return get_peft_model(model, config)


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    from_column: int = 1,
    chunk_tokens: int = 0,
    kernel: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs [N, T] (column t: log p(token t | tokens < t); column 0 is 0).

    Columns before `from_column` are 0 and cost nothing beyond the transformer body: the model
    computes logits only at the positions that predict later tokens (Hugging Face's
    logits_to_keep). The learner passes the first completion column, so a prompt's positions never
    go through the LM head, its float32 copy or the log-softmax (a quarter of that work and memory
    for 256-token prompts and 768-token completions over a 152K vocabulary).

    With `with_entropy`, also the entropy [N, T] of the distribution each token was drawn from;
    differentiable only with `entropy_grad` (an entropy bonus). Without it the entropy is a metric,
    and its [N, T, V] intermediates are freed at once instead of living on in the autograd graph
    until the micro-batch ends (on a GPU, ~10 GB at 8 x 1024 tokens of a 152K vocabulary).
    Logits are divided by the sampling temperature, as the rollout engine sampled them.

    With `chunk_tokens` > 0 the LM head runs that many positions at a time and the [N, T, V]
    logits never exist (models.chunked_logprobs): same numbers to float rounding. `kernel` "liger":
    liger-kernel's fused LM head (models.liger_logprobs; log-probs only, no entropy).
    """
    from grpo_ray.models.chunked_logprobs import HeadOptions, head_logprobs

    # Inputs go where the model's weights are (a DeepSpeed engine or a plain module, CPU or GPU).
    device = next(model.parameters()).device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    first = max(1, min(from_column, input_ids.shape[1] - 1))
    # Logits at positions first-1 .. T-1; the last predicts nothing.
    keep = {"logits_to_keep": input_ids.shape[1] - first + 1} if first > 1 else {}
    forward = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **keep)
    options = HeadOptions(temperature, with_entropy, entropy_grad, chunk_tokens, kernel)
    logprobs, entropy = head_logprobs(model, forward, input_ids[:, first:], options)
    before = logprobs.new_zeros((logprobs.shape[0], first))
    logprobs = torch.cat([before, logprobs], dim=1)
    if entropy is not None:
        entropy = torch.cat([before, entropy], dim=1)
    return logprobs, entropy


def prompt_lengths(completion_mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[N] each right-padded row's prompt length: its first completion column, or its whole length
    when it has no completion token."""
    has_completion = completion_mask.any(dim=1)
    return torch.where(has_completion, (completion_mask > 0).int().argmax(dim=1), lengths)


def first_completion_column(completion_mask: torch.Tensor) -> int:
    """The first column in which any row has a completion token (1 when there is none)."""
    columns = completion_mask.any(dim=0).nonzero()
    return int(columns[0]) if len(columns) else 1


# ---------------------------------------------------------------------------------------------
# Weights as the rollout engines name them (Hugging Face state-dict names, LoRA merged)
# ---------------------------------------------------------------------------------------------


def _is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def _export_names(model: torch.nn.Module, adapter_only: bool = False) -> list[tuple[str, torch.nn.Parameter]]:
    """(engine name, parameter) pairs, tied aliases included.

    With `adapter_only` (a peft model), only the LoRA matrices, under peft's own names: an engine
    that wraps the same base model with the same LoraConfig has exactly these parameters.

    A tied lm_head is named although it is the embedding: vLLM's CPU backend keeps a processed copy
    of the LM head, and its in-place reload restores the *old* copy when the checkpoint holds no
    lm_head weight (measured: log-prob gap 1.08 without it, 2e-6 with it). Its bytes travel once, as
    the embedding's (weight_specs marks it alias_of), and receivers load them under both names.
    """
    if adapter_only:
        return [(name, param) for name, param in model.named_parameters() if "lora_" in name]
    if _is_peft(model):
        base = model.get_base_model()
        return [
            (name.replace(".base_layer.", "."), param)
            for name, param in base.named_parameters(remove_duplicate=False)
            if "lora_" not in name
        ]
    return list(model.named_parameters(remove_duplicate=False))


def weight_specs(model: torch.nn.Module, adapter_only: bool = False) -> list[WeightSpec]:
    """The engines' names of the weights, each tied alias marked as the tensor it is (alias_of)."""
    first_name: dict[int, str] = {}
    specs = []
    for name, param in _export_names(model, adapter_only):
        specs.append(
            WeightSpec(
                name=name,
                shape=tuple(_full_shape(param)),
                dtype=str(param.dtype).removeprefix("torch."),
                alias_of=first_name.get(id(param)),
            )
        )
        first_name.setdefault(id(param), name)
    return specs


def _full_shape(param: torch.nn.Parameter) -> torch.Size:
    # ZeRO-3 partitions parameters and keeps the full shape in ds_shape.
    return getattr(param, "ds_shape", param.shape)


def export_parameters(model: torch.nn.Module, adapter_only: bool = False) -> list[torch.nn.Parameter]:
    """Parameters in weight_specs order (for ZeRO-3 gathering)."""
    return [param for _, param in _export_names(model, adapter_only)]


class merged_lora:
    """Context manager: LoRA deltas merged into the base weights, unmerged on exit."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __enter__(self) -> torch.nn.Module:
        if _is_peft(self.model):
            self.model.merge_adapter()
        return self.model

    def __exit__(self, *exc) -> None:
        if _is_peft(self.model):
            self.model.unmerge_adapter()


def load_named_weights(model: torch.nn.Module, weights: Iterator[tuple[str, torch.Tensor]]) -> int:
    """Copy (name, tensor) pairs into a Hugging Face model in place; returns how many were loaded."""
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = 0
    with torch.no_grad():
        for name, tensor in weights:
            if name not in params:
                raise KeyError(f"weight {name} is not a parameter of the rollout model")
            params[name].copy_(tensor)
            loaded += 1
    return loaded


def tensor_of(array: np.ndarray) -> torch.Tensor:
    """A tensor over an array that may come from Ray's object store, whose buffers are read-only.

    torch has no read-only tensors (from_numpy warns and would let a write corrupt the shared
    buffer), so such an array is copied; np.require copies only then. The copy is one pass over
    rows that a forward pass then reads many times over."""
    return torch.from_numpy(np.require(array, requirements="W"))
