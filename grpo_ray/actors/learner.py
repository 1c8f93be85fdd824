"""LearnerWorker: one DeepSpeed engine per data-parallel rank; applies the GRPO update.

A plain class; the cluster layer makes it a Ray actor. It never imports vLLM.

Exactness across ranks: the loss of each micro-batch is normalised by the step's *global* token
(or sequence) count, then multiplied by world_size * grad_accum_steps to undo DeepSpeed's
averaging over ranks and accumulation steps. The gradients summed over all micro-batches of all
ranks are then exactly those of the full batch on one rank, whatever the split.
"""

from __future__ import annotations

import contextlib
import math
import os
import time

import numpy as np
import torch

from grpo_ray.actors.deepspeed_setup import (
    build_optimizer,
    deepspeed_config,
    join_learner_world,
    loss_scale,
    safe_checkpoint_engine,
)
from grpo_ray.actors.learner_batch import (
    averaged,
    concat_rows,
    micro_batch,
    split_payload,
    taught_advantages,
    taught_sums,
    turn_credit_moved,
)
from grpo_ray.actors.learner_forward import forward, moved_by_update
from grpo_ray.actors.learner_settings import LearnerSettings
from grpo_ray.actors.state_offload import StateOffload
from grpo_ray.algo import grpo_loss, mismatch_stats
from grpo_ray.algo.micro_batches import plan_micro_batches, spread
from grpo_ray.algo.off_policy import pi_old_and_weights, stale_rows
from grpo_ray.algo.schedules import schedule_lr
from grpo_ray.transport.broadcast import bucket_storage, device_identity, plan_buckets
from grpo_ray.transport.handoff import HandoffRing, RingHandle
from grpo_ray.transport.kept import KeptWeights
from grpo_ray.transport.routes import Seat, SendRoutes, send_routed
from grpo_ray.models.loading import (
    apply_lora,
    export_parameters,
    load_causal_lm,
    load_tokenizer,
    merged_lora,
    sequence_logprobs,
    tensor_of,
    weight_specs,
)
from grpo_ray.models.liger_logprobs import chosen_logprob_kernel
from grpo_ray.quiet import choose_deepspeed_accelerator
from grpo_ray.types import LearnerShard, LearnerStats, SyncReport, WeightSpec


class LearnerWorker:
    def __init__(self, settings: LearnerSettings, rank: int, world_size: int):
        torch.set_num_threads(settings.torch_threads)
        self.settings = settings
        self.rank = rank
        self.world_size = world_size
        self.engine = None
        self._sync_routes = SendRoutes()
        self._ring: HandoffRing | None = None
        self._kept = KeptWeights()  # weights sent, for re-sampling a pipelined batch's lost share
        # The model is built here, not in setup: every role's constructor runs at once, so loading
        # it and importing DeepSpeed (~5 s on 2 cores) overlap the other actors' start.
        choose_deepspeed_accelerator()
        import deepspeed  # noqa: F401

        torch.manual_seed(settings.seed)
        self.model = load_causal_lm(settings.model_path, settings.dtype, quantization=settings.quantization)
        if settings.gradient_checkpointing:
            # Non-reentrant: works with frozen inputs (LoRA) and gives the same gradients.
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if settings.lora_enabled:
            s = settings
            self.model = apply_lora(self.model, s.lora_rank, s.lora_alpha, s.lora_dropout, s.lora_target_modules)

    def ready(self) -> str:
        return f"learner-{self.rank}"

    def setup(self, master_addr: str, master_port: int) -> None:
        """Join the learners' torch.distributed world and build the DeepSpeed engine."""
        import deepspeed

        s, (model, self.model) = self.settings, (self.model, None)  # the engine holds it from here
        join_learner_world(self.rank, self.world_size, master_addr, master_port)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = build_optimizer(s, trainable)
        try:
            self.engine, self.optimizer, _, _ = deepspeed.initialize(
                model=model, optimizer=optimizer, config=deepspeed_config(s, self.world_size)
            )
        except ValueError as err:
            if "fp16 is not supported" not in str(err):
                raise
            raise ValueError(
                "model.dtype: float16: DeepSpeed cannot train fp16 on this learner's device (a CPU without "
                "AVX512-FP16/AMX-FP16); use bfloat16 or float32, or give the learners GPUs (learner.num_gpus)"
            ) from None
        self.engine.checkpoint_engine = safe_checkpoint_engine()
        self.tokenizer = load_tokenizer(s.tokenizer_path)
        self.logprob_kernel = chosen_logprob_kernel(s.logprob_kernel, self.engine, say=self.rank == 0)
        self.offload = StateOffload(self.engine, s.offload_states_between_updates)

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    # -- the update ------------------------------------------------------------------------------

    def train_step(self, shard: LearnerShard, *payload) -> LearnerStats:
        """One optimizer step on this rank's slices.

        payload = the K RolloutSlices of this rank, then (KL in the loss) their K reference log-prob
        arrays, then (distillation) each teacher's K log-prob arrays — passed as top-level arguments
        so Ray resolves the object references here, on the learner, and the driver never holds them.
        """
        started = time.perf_counter()
        moved = self.offload.bring_back()  # learner.offload_states_between_updates: Adam's moments, gradients
        lr = self._set_lr(shard.step)
        skipped_before = self.engine.skipped_steps
        slices, ref_arrays, teachers = split_payload(payload, len(shard.advantages), len(shard.teachers))
        pad = self.tokenizer.pad_token_id
        batch = concat_rows(
            slices, shard.advantages, shard.row_weights, ref_arrays, pad, shard.advantage_slopes, teachers
        )
        turn_credit = turn_credit_moved(batch)
        stale = stale_rows(np.concatenate([sl.policy_versions for sl in slices]), shard.step)
        batch["stale"] = torch.from_numpy(stale)
        self.engine.train()
        micro_batches = self._plan(batch["attention_mask"].sum(dim=1).numpy())
        learner_old: dict[int, torch.Tensor] = {}  # the policy's own log-probs before this step
        sums: dict[str, float] = {}
        students: dict = {}  # distillation: per teacher, the student's side of its gaps (algo/distill.StudentSums)
        tokens = 0
        by_tokens = self.settings.max_tokens_per_micro_batch > 0
        for epoch in range(self.settings.epochs_per_batch):
            for index, rows in enumerate(micro_batches):
                if by_tokens:  # the plan, not DeepSpeed's fixed count, says where the optimizer steps
                    self.engine.set_gradient_accumulation_boundary(index == len(micro_batches) - 1)
                mb = micro_batch(batch, rows, self.engine.device)
                step_metrics = self._micro_step(mb, shard, learner_old, index, first_pass=epoch == 0)
                if len(rows):
                    for name, value in step_metrics.items():
                        sums[name] = sums.get(name, 0.0) + value
                    tokens += int(mb["attention_mask"].sum())
                if len(rows) and epoch == 0 and shard.teachers:
                    for name, part in taught_sums(mb, learner_old[index], shard.teachers).items():
                        students[name] = students[name] + part if name in students else part
        if by_tokens:
            self.engine.set_gradient_accumulation_boundary(None)  # back to DeepSpeed's own count
        # How far the step moved its sampled tokens (update/moved): the clip cannot bound one update.
        first = micro_batches[0]
        went = moved_by_update(
            self.engine, self.settings, self.logprob_kernel, batch, first, learner_old[0], shard.temperature
        )
        used = sum(1 for rows in micro_batches if len(rows))
        metrics = averaged(sums, used, used * self.settings.epochs_per_batch) | went
        # A NaN or infinite gradient (or loss) leaves the weights as they were: DeepSpeed's ZeRO
        # optimizer, or SkipNonFiniteAdamW without ZeRO, skipped the step and DeepSpeed counted it.
        metrics["update/skipped"] = float(self.engine.skipped_steps > skipped_before)
        metrics["actor/lr"] = lr
        if self.engine.fp16_enabled() and (scale := loss_scale(self.engine.optimizer)) is not None:
            metrics["actor/loss_scale"] = scale
        in_loss = np.concatenate(shard.row_weights) > 0
        metrics["update/stale_rows"] = float(stale[in_loss].mean()) if in_loss.any() else 0.0
        if turn_credit is not None:
            metrics["actor/turn_credit"] = turn_credit
        grad_norm = self.engine.get_global_grad_norm()
        if grad_norm is not None and math.isfinite(float(grad_norm)):
            metrics["actor/grad_norm"] = float(grad_norm)
        metrics.update(moved | self.offload.send_away())  # to host memory until the next update
        seconds = time.perf_counter() - started
        return LearnerStats(self.rank, metrics, num_tokens=tokens, seconds=seconds, student_sums=students)

    def _plan(self, lengths: np.ndarray) -> list[np.ndarray]:
        """Row indices of each micro-batch (algo.micro_batches); by token budget, every rank ends up
        with the same count, the largest any rank's plan needs (ZeRO reduces at every backward)."""
        s = self.settings
        plan = plan_micro_batches(lengths, s.micro_batch_size, s.max_tokens_per_micro_batch, s.packing)
        if s.max_tokens_per_micro_batch > 0 and self.world_size > 1:
            import torch.distributed as dist

            count = torch.tensor([len(plan)], device=self.engine.device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            plan = spread(plan, int(count), lengths)
        return plan

    def _micro_step(
        self,
        mb: dict[str, torch.Tensor],
        shard: LearnerShard,
        learner_old: dict[int, torch.Tensor],
        index: int,
        first_pass: bool,
    ) -> dict[str, float]:
        """Forward, loss, backward and DeepSpeed's step on one micro-batch; its metrics."""
        s = self.settings
        logprobs, entropy = forward(self.engine, s, self.logprob_kernel, mb, shard.temperature, entropy=True)
        if first_pass:
            learner_old[index] = logprobs.detach()
        old_logprobs, is_weights = pi_old_and_weights(
            learner_old[index], mb["rollout_logprobs"], mb["stale"], s.epochs_per_batch, s.staleness_is_cap, s.tis_cap
        )
        out = grpo_loss(
            logprobs=logprobs,
            old_logprobs=old_logprobs,
            advantages=taught_advantages(mb, learner_old[index], shard.distill_coef or 0.0),
            mask=mb["completion_mask"] * mb["row_weights"][:, None],
            clip_low=s.clip_low,
            clip_high=s.clip_high,
            dual_clip=s.dual_clip,
            ref_logprobs=mb.get("ref_logprobs"),
            kl_estimator=s.kl_estimator,
            kl_coef=s.kl_coef if shard.kl_coef is None else shard.kl_coef,  # algorithm.kl_controller's
            entropy=entropy,
            entropy_coef=s.entropy_coef,
            is_weights=is_weights,
            aggregation=s.loss_aggregation,
            norm_length=shard.norm_length,
            global_tokens=shard.global_tokens,
            global_sequences=float(shard.global_sequences),
        )
        self.engine.backward(out.loss * self.world_size * s.grad_accum_steps)
        self.engine.step()
        metrics = {name: float(value) for name, value in out.metrics.items()}
        if first_pass:
            metrics.update(mismatch_stats(logprobs.detach(), mb["rollout_logprobs"], mb["completion_mask"]))
        return metrics

    def _set_lr(self, step: int) -> float:
        """Set the LR of step `step` on every parameter group (DeepSpeed's ZeRO and fp16 wrappers
        share their inner optimizer's groups); a pure function of the step, so resume is exact."""
        lr = schedule_lr(step, self.settings.lr_segments) if self.settings.lr_segments else self.settings.lr
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        return lr

    @torch.no_grad()
    def score(self, input_ids: np.ndarray, attention_mask: np.ndarray, temperature: float = 1.0) -> np.ndarray:
        """Log-probs [N, T] of given sequences under the current weights (the weight-sync probe)."""
        self.engine.eval()
        logprobs, _ = sequence_logprobs(self.engine, tensor_of(input_ids), tensor_of(attention_mask), temperature)
        return logprobs.float().cpu().numpy()

    def parameters_snapshot(self) -> dict[str, np.ndarray]:
        """Full parameters by name (tests compare ranks and runs with it). Collective under ZeRO-3."""
        params = dict(zip([spec.name for spec in weight_specs(self.module)], export_parameters(self.module)))
        with self._gathered(list(params.values())):
            return {name: p.detach().float().cpu().numpy().copy() for name, p in params.items()}

    def policy_weights(self) -> dict[str, np.ndarray] | None:
        """The policy as a plain model (LoRA merged), for the reference refresh: rank 0 returns it,
        the others None. Every rank calls this (ZeRO-3 gathers are collective)."""
        with torch.no_grad(), merged_lora(self.module):
            snapshot = self.parameters_snapshot()
        return snapshot if self.rank == 0 else None

    # -- weight broadcast ------------------------------------------------------------------------

    def weight_plan(self, bucket_bytes: int, adapter_only: bool = False) -> tuple[list[WeightSpec], list[list[int]]]:
        """What a sync sends: the policy's weights (LoRA merged), or with adapter_only the LoRA
        matrices alone, for engines that apply the adapter themselves."""
        specs = weight_specs(self.module, adapter_only)
        params = export_parameters(self.module, adapter_only)
        buckets = plan_buckets(specs, bucket_bytes)
        # Without ZeRO or a mixed-precision wrapper, the optimizer updates the module's own
        # tensors in place: lay them out bucket by bucket, so a sync sends them as they lie
        # instead of packing a copy. (ZeRO-1/2 keep them in DeepSpeed's flat groups already.)
        if self.settings.zero_stage == 0 and not (self.engine.bfloat16_enabled() or self.engine.fp16_enabled()):
            with torch.no_grad():
                bucket_storage(dict(zip([spec.name for spec in specs], params)), specs, buckets)
        return specs, buckets

    def device_identity(self) -> str:
        """This rank's device (for the weight sync's choice of routes and backend)."""
        return device_identity()

    def open_handoff_ring(self, slot_bytes: int, host: bool = False) -> RingHandle:
        """Rank 0 only: the two slots of the hand-off to receivers on this device (transport/handoff.py;
        `host`: in shared host memory even on a GPU), in place of any before; HandoffRefused says why
        there can be none."""
        if self._ring is not None:
            self._ring.close()
        self._ring = HandoffRing.create(slot_bytes, torch.device(self.engine.device), device_identity(), host)
        return self._ring.handle

    def host_weight_sync(self, broadcast_seat: Seat | None, handoff_seat: Seat | None) -> None:
        """Rank 0 only: host the sync's groups (the broadcast's, the hand-off's signals) as their rank 0."""
        if handoff_seat is None and self._ring is not None:  # no receiver takes it: free its memory
            self._ring.close()
            self._ring = None
        self._sync_routes = SendRoutes.host(broadcast_seat, handoff_seat, self._ring if handoff_seat else None)

    def raw_broadcast(self, num_bytes: int) -> float:
        """Rank 0 only: the sync's yardstick for num_bytes (routes.SendRoutes.raw_seconds)."""
        return self._sync_routes.raw_seconds(num_bytes)

    def send_weights(
        self, version: int, buckets: list[list[int]], adapter_only: bool = False, keep: int = 0, kept: bool = False
    ) -> SyncReport | None:
        """Every rank calls this (ZeRO-3 gathers are collective); rank 0 sends, others return None.
        keep: rank 0 keeps a copy of the newest `keep` versions sent (transport/kept.py); kept: rank 0
        alone sends the copy of `version` instead of the weights it holds now."""
        if kept:
            started = time.perf_counter()
            checksum, num_bytes = send_routed(
                self._sync_routes, iter(self._kept.tensors(version)), weight_specs(self.module, adapter_only), buckets
            )
            return SyncReport("learner", version, checksum, num_bytes, time.perf_counter() - started)
        started = time.perf_counter()
        params = export_parameters(self.module, adapter_only)
        specs = weight_specs(self.module, adapter_only)

        def bucket_tensors():
            for bucket in buckets:
                with self._gathered([params[i] for i in bucket]):
                    for i in bucket:
                        yield params[i].data

        with torch.no_grad(), contextlib.nullcontext() if adapter_only else merged_lora(self.module):
            if self.rank != 0:
                for _ in bucket_tensors():
                    pass
                return None
            try:
                tensors = self._kept.keeping(version, bucket_tensors(), keep) if keep else bucket_tensors()
                checksum, num_bytes = send_routed(self._sync_routes, tensors, specs, buckets)
            except Exception:
                # A receiver died mid-sync. Dropping this end closes its sockets, so the other receivers
                # fail now rather than at the timeout, and can join the group the driver forms next.
                self._sync_routes = SendRoutes()
                raise
        return SyncReport(
            who="learner",
            version=version,
            checksum=checksum,
            num_bytes=num_bytes,
            seconds=time.perf_counter() - started,
        )

    def _gathered(self, params: list[torch.nn.Parameter]):
        if self.settings.zero_stage == 3:
            import deepspeed

            return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
        return contextlib.nullcontext()

    # -- checkpoints -----------------------------------------------------------------------------

    def save_checkpoint(self, folder: str) -> None:
        """Model, optimizer and DeepSpeed counters (every rank writes its part), and this rank's RNG.
        Collective: every rank calls it."""
        from grpo_ray.models.tensor_files import save_tensors

        with self.offload.present():
            self.engine.save_checkpoint(folder, tag="deepspeed", save_latest=False)
        save_tensors({"cpu": torch.get_rng_state()}, os.path.join(folder, f"rng_rank{self.rank}.pt"))

    def load_checkpoint(self, folder: str) -> None:
        """Every rank calls it; files are read with weights_only=True (see grpo_ray.training.checkpoint)."""
        from grpo_ray.models.tensor_files import CheckpointError, load_tensors

        with self.offload.present():
            loaded, _ = self.engine.load_checkpoint(folder, tag="deepspeed", load_module_strict=True)
        if loaded is None:
            raise CheckpointError(f"{folder} holds no DeepSpeed checkpoint of learner rank {self.rank}")
        torch.set_rng_state(load_tensors(os.path.join(folder, f"rng_rank{self.rank}.pt"))["cpu"])

    # -- saving ----------------------------------------------------------------------------------

    def save_model(self, path: str) -> str | None:
        """Hugging Face folder (or LoRA adapter) with the tokenizer; rank 0 writes."""
        params = export_parameters(self.module)
        with self._gathered(params):
            if self.rank == 0:
                self.module.save_pretrained(path)
                self.tokenizer.save_pretrained(path)
                return path
        return None
