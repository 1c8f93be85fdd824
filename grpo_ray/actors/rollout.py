"""RolloutWorker: samples G completions per prompt and packs them into per-learner-rank slices.

A plain class (the cluster layer makes it a Ray actor); it never imports DeepSpeed. The engine (hf
or vllm) sits behind one interface: generate, score, load_weights, bucket_storage.
A vllm engine's own worker processes join the weight broadcast instead of this process
(`joins_weight_sync`: one rank per tensor-parallel shard; vllm_engine.py), except with LoRA.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from grpo_ray.actors.engines import EngineSpec, build_engine
from grpo_ray.actors.episodes import EpisodeRunner, EpisodeSettings, episode_inputs, pack_episodes, pack_groups
from grpo_ray.actors.slices import pack_slice
from grpo_ray.actors.worker_errors import StaleWeightsError, end_process_soon, engine_died, log_size
from grpo_ray.algo.diversity import group_distinct_ratio
from grpo_ray.transport.broadcast import ReceiveTally, device_identity
from grpo_ray.transport.handoff import HandoffReceiver, RingHandle, check_ring
from grpo_ray.transport.routes import BucketSource, Seat, join_seat, receive_buckets, receive_into, timed_receive
from grpo_ray.models.loading import load_tokenizer, resolve_model_path
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
        # Episodes (actors/episodes.py): each sample an episode; the environment's processes die with this worker.
        self.episodes = EpisodeRunner(settings.environment, self.tokenizer) if settings.environment else None
        self._asleep: set[str] = set()  # what of the engine's memory sleeps: "weights", "kv_cache"
        self.policy_version = 0
        self._group: BucketSource | None = None
        self._specs: list[WeightSpec] = []
        self._buckets: list[list[int]] = []
        self._in_place: list | None = None  # the engine's weights as one tensor per bucket (hf engine)
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
        """Completions for `prompts`, cut into `num_slices` equal slices (one per learner rank).

        Group ids are `group_offset + k` for the k-th prompt, so ids are unique across workers.
        Returns a bare slice when num_slices == 1 (Ray's num_returns=1 wants one value).
        expected_version: the weights the driver believes this worker holds; a worker Ray restarted
        while idle holds the initial ones and must not sample with them (StaleWeightsError).
        """
        if expected_version is not None and expected_version != self.policy_version:
            raise StaleWeightsError(self.settings.index, self.policy_version, expected_version)
        # The version the batch starts with labels its rows: a sync may land while it generates.
        version = self.policy_version
        groups = self._engine_call(self.engine.generate, [p.token_ids for p in prompts], sampling, samples=True)
        rows = [
            (group_offset + k, prompt, completion)
            for k, (prompt, completions) in enumerate(zip(prompts, groups))
            for completion in completions
        ]
        # Measured here, where every group is whole: a slice may hold part of a group.
        diversity = {
            group_offset + k: group_distinct_ratio([c.text for c in completions])
            for k, completions in enumerate(groups)
        }
        per_slice = len(rows) // num_slices
        pad = self.tokenizer.pad_token_id
        slices = tuple(
            pack_slice(rows[i * per_slice : (i + 1) * per_slice], pad, version, diversity) for i in range(num_slices)
        )
        return slices[0] if num_slices == 1 else slices

    def generate_episodes(
        self,
        prompts: list[Prompt],
        group_offset: int,
        sampling: SamplingSettings,
        num_slices: int,
        expected_version: int | None = None,
    ) -> tuple[RolloutSlice, ...] | RolloutSlice:
        """As `generate`, each of a prompt's G samples an episode with the recipe's environment
        (actors/episodes.py), seeded by its place in the step: a share issued again is the same."""
        rows, seeds, turn = self._episode_inputs(prompts, group_offset, sampling, expected_version)
        version, g = self.policy_version, sampling.samples_per_prompt
        episodes = self._engine_call(self.episodes.run, rows, seeds, self.engine.turns(turn), samples=True)
        entries = [(group_offset + k, prompts[k], episodes[k * g + j]) for k in range(len(prompts)) for j in range(g)]
        # Measured here, where every group is whole: a slice may hold part of a group (as in `generate`).
        diversity = {
            group_offset + k: group_distinct_ratio([e.answer for e in episodes[k * g : (k + 1) * g]])
            for k in range(len(prompts))
        }
        per_slice = len(entries) // num_slices
        pad, credit, keep = self.tokenizer.pad_token_id, self.settings.environment.turn_credit, sampling.keep_messages
        slices = tuple(
            pack_episodes(entries[i * per_slice : (i + 1) * per_slice], pad, version, diversity, credit, keep)
            for i in range(num_slices)
        )
        return slices[0] if num_slices == 1 else slices

    def generate_episode_chunks(
        self,
        prompts: list[Prompt],
        group_offset: int,
        sampling: SamplingSettings,
        groups_per_chunk: int,
        expected_version: int | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[RolloutSlice]:
        """As `generate_chunks`, each sample an episode: a slice of `groups_per_chunk` groups each time
        that many groups' episodes are all done, in the order they finish; the episodes and their
        seeds are those of `generate_episodes`."""
        rows, seeds, turn = self._episode_inputs(prompts, group_offset, sampling, expected_version)
        version = self.policy_version
        stream = self.episodes.stream(rows, seeds, self.engine.turns(turn), sampling.samples_per_prompt, stop)
        for groups in self._in_chunks(stream, groups_per_chunk, stop):
            yield self._episode_slice(groups, prompts, group_offset, version, sampling.keep_messages)

    def _episode_inputs(
        self, prompts: list[Prompt], group_offset: int, sampling: SamplingSettings, expected_version: int | None
    ) -> tuple[list[dict], list[int], SamplingSettings]:
        if expected_version is not None and expected_version != self.policy_version:
            raise StaleWeightsError(self.settings.index, self.policy_version, expected_version)
        if self.episodes is None:
            raise RuntimeError(f"{self.name} has no environment (environment.spec): it cannot run episodes")
        return episode_inputs(prompts, group_offset, sampling)

    def _episode_slice(
        self, groups: list[tuple[int, list]], prompts: list[Prompt], group_offset: int, version: int, keep: bool
    ) -> RolloutSlice:
        credit = self.settings.environment.turn_credit
        return pack_groups(groups, prompts, group_offset, self.tokenizer.pad_token_id, version, credit, keep)

    def generate_chunks(
        self,
        prompts: list[Prompt],
        group_offset: int,
        sampling: SamplingSettings,
        groups_per_chunk: int,
        expected_version: int | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[RolloutSlice]:
        """Completions for `prompts`, handed back as they finish: a slice of `groups_per_chunk` whole
        groups each time that many are done (the last one may hold fewer), in the order they finish.

        The cluster layer runs it as a streaming call (each slice an object ref the moment it is
        yielded) and passes `stop`, true once the driver cancelled the call: the engine then aborts
        the requests still running. Group ids and sampling seeds are those of `generate`."""
        if expected_version is not None and expected_version != self.policy_version:
            raise StaleWeightsError(self.settings.index, self.policy_version, expected_version)
        pad, version = self.tokenizer.pad_token_id, self.policy_version
        stream = self._engine_call(self.engine.generate_stream, [p.token_ids for p in prompts], sampling, stop)
        for groups in self._in_chunks(stream, groups_per_chunk, stop):
            yield self._chunk(groups, prompts, group_offset, pad, version)

    def _in_chunks(
        self, stream: Iterator[tuple[int, list]], groups_per_chunk: int, stop: Callable[[], bool] | None
    ) -> Iterator[list[tuple[int, list]]]:
        """An engine's stream of (k, group k) cut into lists of `groups_per_chunk` groups, the last
        one shorter; nothing more once `stop` says the call was cancelled."""
        done: list[tuple[int, list]] = []
        for k, group in self._engine_stream(stream):
            done.append((k, group))
            if len(done) == groups_per_chunk:
                yield done
                done = []
        if done and not (stop is not None and stop()):
            yield done

    def _chunk(
        self, groups: list[tuple[int, list]], prompts: list[Prompt], group_offset: int, pad: int, version: int
    ) -> RolloutSlice:
        rows = [(group_offset + k, prompts[k], completion) for k, completions in groups for completion in completions]
        diversity = {group_offset + k: group_distinct_ratio([c.text for c in completions]) for k, completions in groups}
        return pack_slice(rows, pad, version, diversity)

    def score(self, input_ids: np.ndarray, attention_mask: np.ndarray, temperature: float = 1.0) -> np.ndarray:
        return self._engine_call(self.engine.score, input_ids, attention_mask, temperature)

    # -- weight sync -----------------------------------------------------------------------------

    @property
    def _shards_receive(self) -> bool:
        """Whether the engine's own worker processes take the broadcast ranks (vLLM without LoRA)."""
        return getattr(self.engine, "joins_weight_sync", False)

    def device_identity(self) -> list[str]:
        """The device of each of this worker's sync ranks (for the choice of routes and backend); its
        length is the number of ranks the worker takes."""
        if self._shards_receive:
            return self._engine_call(self.engine.device_identities)
        return [device_identity()]

    def check_handoff(self, ring: RingHandle) -> list[str | None]:
        """For each of this worker's ranks: None if it can receive through learner rank 0's hand-off
        ring, else why not (one line)."""
        if self._shards_receive:
            return self._engine_call(self.engine.check_handoff, ring)
        return [check_ring(ring, device_identity())]

    def join_weight_sync(self, seats: list[Seat], specs: list[WeightSpec], buckets: list[list[int]]) -> None:
        """Take a seat per rank (transport/routes.py): the broadcast group, or the hand-off."""
        self._specs, self._buckets = specs, buckets
        if self._shards_receive:
            self._group = None
            self._engine_call(self.engine.join_weight_sync, seats, specs, buckets)
            return
        self._group = join_seat(seats[0], device_identity())
        # Where the engine can, its weights become the buckets' storage, no load copy: a broadcast lands
        # in them (on the group's device only), a hand-off is copied into them from wherever its ring is.
        handed = isinstance(self._group, HandoffReceiver)
        self._in_place = self.engine.bucket_storage(
            specs, buckets, getattr(self.engine, "device", None) if handed else self._group.device
        )

    def raw_broadcast(self, num_bytes: int) -> float | None:
        """The receiving side of the learner's plain broadcast of num_bytes (weight-sync yardstick);
        None for a rank that takes the hand-off."""
        if self._shards_receive:
            return self._engine_call(self.engine.raw_broadcast, num_bytes)
        return timed_receive(self._group, num_bytes)

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
        started = time.perf_counter()
        if self._shards_receive:
            drop, self._drop = self._drop, None
            shards = self._engine_call(self.engine.receive_weights, version, drop, self._keep_old)
            self.policy_version = version
            return [
                SyncReport(
                    who=f"{self.name} (tp rank {s['shard']})",
                    version=version,
                    checksum=s["checksum"],
                    num_bytes=s["num_bytes"],
                    seconds=s["seconds"],
                    during_generation=s["during_generation"],
                )
                for s in shards
            ]
        assert self._group is not None, "join_weight_sync first"
        tally = ReceiveTally()
        try:
            if self._keep_old and self._in_place is not None:  # the drill: received and counted, then put back
                kept = [tensor.clone() for tensor in self._in_place]
                receive_into(self._group, self._in_place, tally)
                for tensor, old in zip(self._in_place, kept):
                    tensor.copy_(old)
            elif self._keep_old:
                for _ in receive_buckets(self._group, self._specs, self._buckets, tally):
                    pass
            elif self._in_place is not None:
                receive_into(self._group, self._in_place, tally)
            else:
                self.engine.load_weights(receive_buckets(self._group, self._specs, self._buckets, tally))
        except Exception:
            self._group = None  # broken (the sender or a peer died): the driver forms a new one
            raise
        self.policy_version = version
        return [
            SyncReport(
                who=self.name,
                version=version,
                checksum=tally.checksum,
                num_bytes=tally.num_bytes,
                seconds=time.perf_counter() - started,
            )
        ]

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
