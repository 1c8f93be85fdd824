"""RolloutWorker: samples G per prompt and packs them into per-learner-rank slices.

A plain class (the cluster layer makes it a Ray actor); it never imports DeepSpeed. The engine (hf
or vllm) sits behind one interface: generate, generate_stream, turns, score, load_weights,
bucket_storage. Two choices are made once, when the worker starts:

    the sampler (actors/samplers.py)           one completion a sample, or an episode with the
                                               recipe's environment
    the weight receiver (weight_receivers.py)  this process, or a vLLM engine's own shards

The worker delivers a share two ways, whatever its sampler: whole, one slice per learner rank
(`generate`), or group by group as they finish (`generate_chunks`, a Ray streaming call).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from grpo_ray.actors.engines import EngineSpec, build_engine
from grpo_ray.actors.episodes import EpisodeRunner, EpisodeSettings
from grpo_ray.actors.samplers import OneTurn, Sampler, WithEnvironment
from grpo_ray.actors.slices import Sample, pack_groups
from grpo_ray.actors.weight_receivers import choose_receiver
from grpo_ray.actors.worker_errors import StaleWeightsError, end_process_soon, engine_died, log_size
from grpo_ray.models.loading import load_tokenizer, resolve_model_path
from grpo_ray.transport.handoff import RingHandle
from grpo_ray.transport.routes import Seat
from grpo_ray.types import Prompt, RolloutSlice, SamplingSettings, SyncReport, WeightSpec


@dataclass(frozen=True)
class LoraShape:
    """The adapter an hf engine wraps its model in (the learner's model.lora settings)."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]


@dataclass(frozen=True)
class RolloutWorkerSettings:
    index: int
    backend: str  # "hf" | "vllm"
    model_path: str
    tokenizer_path: str
    dtype: str
    seed: int
    torch_threads: int
    max_model_len: int
    vllm_enforce_eager: bool = True
    vllm_gpu_memory_utilization: float = 0.5
    vllm_cpu_kv_cache_gb: float = 1.0
    vllm_block_size: int | None = None  # None: vLLM's default
    vllm_sleep_level: int = 0  # 0: never sleeps; 1 or 2: sleep() frees the GPU for the update
    vllm_engine_args: dict = field(default_factory=dict)  # more of vLLM's engine arguments, passed as they are
    tensor_parallel_size: int = 1
    lora: LoraShape | None = None  # the engine applies this adapter itself; syncs send only its matrices
    environment: EpisodeSettings | None = None  # episodes with this environment; None: one completion a sample
    vllm_log_file: str | None = None  # vLLM's own log lines (actors/engines.py: route_vllm_logs)


class RolloutWorker:
    def __init__(self, settings: RolloutWorkerSettings):
        import torch

        torch.set_num_threads(settings.torch_threads)
        self.settings = settings
        self.name = f"rollout-{settings.index}"
        self.tokenizer = load_tokenizer(settings.tokenizer_path)
        model_path = resolve_model_path(settings.model_path)
        self._log_start = log_size(settings.vllm_log_file)  # a dead engine's cause is looked for after this
        self._sampled = 0  # sampling calls the engine answered (a death before any: a restart did not cure it)
        self.engine = build_engine(
            EngineSpec(
                settings.backend,
                model_path,
                settings.dtype,
                seed=settings.seed,
                lora=settings.lora,
                max_model_len=settings.max_model_len,
                enforce_eager=settings.vllm_enforce_eager,
                gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
                cpu_kv_cache_gb=settings.vllm_cpu_kv_cache_gb,
                block_size=settings.vllm_block_size,
                tensor_parallel_size=settings.tensor_parallel_size,
                sleep_mode=settings.vllm_sleep_level > 0,
                options=settings.vllm_engine_args,
                log_file=settings.vllm_log_file,
            ),
            self.tokenizer,
        )
        # Episodes (actors/episodes.py): the environment's processes start here and die with this worker.
        self.sampler: Sampler = (
            WithEnvironment(self.engine, EpisodeRunner(settings.environment, self.tokenizer))
            if settings.environment
            else OneTurn(self.engine)
        )
        self.receiver = choose_receiver(self.engine, self.name)
        self._asleep: set[str] = set()  # what of the engine's memory sleeps: "weights", "kv_cache"
        self.policy_version = 0
        self._drop: dict[int, int] | None = None  # fault drill for the next sync (drop_bucket_in_next_sync)
        self._keep_old: list[int] = []  # fault drill: shards that stop loading what they receive (keep_old_weights)

    def ready(self) -> str:
        return self.name

    def pid(self) -> int:
        """This process's id: a restarted worker answers with a new one."""
        return os.getpid()

    # -- generation ------------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[Prompt],
        group_offset: int,
        sampling: SamplingSettings,
        num_slices: int,
        expected_version: int | None = None,
    ) -> tuple[RolloutSlice, ...] | RolloutSlice:
        """G samples of each prompt, cut into `num_slices` equal slices (one per learner rank).

        Group ids are `group_offset + k` for the k-th prompt, so ids are unique across workers, and
        each sample's seed follows from its place in the step: a share issued again is the same.
        Returns a bare slice when num_slices == 1 (Ray's num_returns=1 wants one value).
        expected_version: the weights the driver believes this worker holds; a worker Ray restarted
        while idle holds the initial ones and must not sample with them (StaleWeightsError).
        """
        # The version the batch starts with labels its rows: a sync may land while it generates.
        version = self._check_version(expected_version)
        groups = self._engine_call(self.sampler.groups, prompts, group_offset, sampling, samples=True)
        slices = self._pack(list(enumerate(groups)), prompts, group_offset, version, sampling, num_slices)
        return slices[0] if num_slices == 1 else tuple(slices)

    def generate_chunks(
        self,
        prompts: list[Prompt],
        group_offset: int,
        sampling: SamplingSettings,
        groups_per_chunk: int,
        expected_version: int | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[RolloutSlice]:
        """As `generate`, handed back as they finish: a slice of `groups_per_chunk` whole groups each
        time that many are done (the last one may hold fewer), in the order they finish.

        The cluster layer runs it as a streaming call (each slice an object ref the moment it is
        yielded) and passes `stop`, true once the driver cancelled the call: the engine then aborts
        what is still running. Group ids and sampling seeds are those of `generate`."""
        version = self._check_version(expected_version)
        stream = self.sampler.stream(prompts, group_offset, sampling, stop)
        done: list[tuple[int, list[Sample]]] = []
        for k, group in self._engine_stream(stream):
            done.append((k, group))
            if len(done) == groups_per_chunk:
                yield self._pack(done, prompts, group_offset, version, sampling)[0]
                done = []
        if done and not (stop is not None and stop()):
            yield self._pack(done, prompts, group_offset, version, sampling)[0]

    def _check_version(self, expected: int | None) -> int:
        if expected is not None and expected != self.policy_version:
            raise StaleWeightsError(self.settings.index, self.policy_version, expected)
        return self.policy_version

    def _pack(
        self,
        groups: list[tuple[int, list[Sample]]],
        prompts: list[Prompt],
        group_offset: int,
        version: int,
        sampling: SamplingSettings,
        num_slices: int = 1,
    ) -> list[RolloutSlice]:
        pad, credit = self.tokenizer.pad_token_id, self.sampler.turn_credit
        return pack_groups(groups, prompts, group_offset, pad, version, num_slices, credit, sampling.keep_messages)

    def score(self, input_ids: np.ndarray, attention_mask: np.ndarray, temperature: float = 1.0) -> np.ndarray:
        return self._engine_call(self.engine.score, input_ids, attention_mask, temperature)

    def close(self) -> None:
        """End the engine (vLLM's processes) and the environment's processes now, not at exit."""
        self.engine.shutdown()
        self.sampler.close()

    # -- weight sync -----------------------------------------------------------------------------

    def device_identity(self) -> list[str]:
        """The device of each of this worker's sync ranks (for the choice of routes and backend); its
        length is the number of ranks the worker takes."""
        return self._engine_call(self.receiver.device_identities)

    def check_handoff(self, ring: RingHandle) -> list[str | None]:
        """For each of this worker's ranks: None if it can receive through learner rank 0's hand-off
        ring, else why not (one line)."""
        return self._engine_call(self.receiver.check_handoff, ring)

    def join_weight_sync(self, seats: list[Seat], specs: list[WeightSpec], buckets: list[list[int]]) -> None:
        """Take a seat per rank (transport/routes.py): the broadcast group, or the hand-off."""
        self._engine_call(self.receiver.join, seats, specs, buckets)

    def raw_broadcast(self, num_bytes: int) -> float | None:
        """The receiving side of the learner's plain broadcast of num_bytes (weight-sync yardstick);
        None for a rank that takes the hand-off."""
        return self._engine_call(self.receiver.raw_broadcast, num_bytes)

    def drop_bucket_in_next_sync(self, shard: int, bucket: int) -> None:
        """Fault drill (tests): in the next sync, vLLM shard `shard` neither loads nor counts `bucket`."""
        self._drop = {shard: bucket}

    def keep_old_weights(self, shard: int = 0, keep: bool = True) -> None:
        """Fault drill (tests): from the next sync on, the engine (vLLM: its shard `shard`) counts every bucket,
        so its digests match, but loads none: only the weight probe can catch it. keep=False ends the drill."""
        self._keep_old = sorted(set(self._keep_old) | {shard}) if keep else [s for s in self._keep_old if s != shard]

    def sleep(self) -> None:
        """After the rollout, free the engine's GPU for the update (rollout.vllm.sleep_level > 0)."""
        if self.settings.vllm_sleep_level and not self._asleep:
            self._engine_call(self.engine.sleep, self.settings.vllm_sleep_level)
            self._asleep = {"weights", "kv_cache"}

    def wake(self, tags: list[str]) -> None:
        """Take back the parts of the engine's memory named in `tags` that sleep (none: nothing to do,
        as for an engine just restarted by Ray)."""
        waking = [tag for tag in tags if tag in self._asleep]
        if waking:
            self._engine_call(self.engine.wake_up, waking)
            self._asleep -= set(waking)

    def receive_weights(self, version: int) -> list[SyncReport]:
        """Receive every bucket from learner rank 0 and load it into the engine in place: one report
        per broadcast rank of this worker (a vLLM engine's shards each report what they loaded)."""
        drop, self._drop = self._drop, None
        reports = self._engine_call(self.receiver.receive, version, drop, self._keep_old)
        self.policy_version = version
        return reports

    def _engine_stream(self, stream: Iterator):
        """Iterate an engine's stream as _engine_call calls a method (a dead engine ends the worker)."""
        while True:
            try:
                item = self._engine_call(next, stream, samples=True)
            except StopIteration:
                return
            yield item

    def _engine_call(self, method, *args, samples: bool = False):
        """Call the engine (`samples`: a generation, counted once answered; the weight probe's scoring
        after a restart's sync is not one). If its processes died,
        answer with why (EngineDiedError: the root cause from the engine's log) and end this worker
        a moment later, so that Ray restarts it with a fresh engine; the driver's recovery brings it
        to the current weights, or stops the run when the fresh engine dies of the same cause."""
        try:
            result = method(*args)
        except Exception as err:
            if getattr(self.engine, "dead", False):
                died = engine_died(
                    self.settings.index, self.settings.vllm_log_file, self._log_start, self._sampled, err
                )
                print(f"{died}; the worker exits so that Ray replaces it", file=sys.stderr, flush=True)
                end_process_soon()
                raise died from None
            raise
        self._sampled += samples
        return result
