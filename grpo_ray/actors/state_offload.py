"""The learner's Adam moments and gradients in host memory between updates
(learner.offload_states_between_updates), so that one GPU taken in turns can give a sleeping vLLM
engine's KV cache their room.

vLLM takes its share of the GPU when it starts, before the learners' first update has created
Adam's moments; the engine sleeps through every update and wakes its KV cache after the weight
sync. Moments and gradients left on the GPU would then have to fit beside the awake engine. Moved
to pinned host memory at the end of each update (DeepSpeed's `offload_states`, ZeRO 1 and 2),
they are not: the next update brings them back first. The weights stay (the sync and the probe
read them), and so does the float32 master copy, which DeepSpeed builds on the GPU at start-up
while vLLM holds its share: what it frees later no engine could take.

DeepSpeed 0.19's ZeRO-1/2 optimizer keeps views of Adam's moments of its own: after its first
step it links each parameter's `_hp_mapping.optim_fragment` to slices of the optimizer's state
(for `safe_get_full_optimizer_state` and universal checkpoints), and `offload_states` moves the
state without touching them. Those views kept the first step's moments alive on the GPU (an
H100 on 2026-11-27: the first offload freed 0 of 4.06 MiB, each later one freed only the copy
the reload had made), and pointed at stale values after a reload. So the views are dropped
before the moments leave and linked again to the moments that come back.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch

GIB = 1 << 30


class StateOffload:
    """Moves a DeepSpeed ZeRO-1/2 engine's Adam moments and gradients to host memory and back."""

    def __init__(self, engine, enabled: bool):
        self.engine = engine
        self.enabled = enabled
        self.away = False

    def send_away(self) -> dict[str, float]:
        """After an update: the states to host memory; the seconds it took and the GPU memory it freed."""
        if not self.enabled or self.away:
            return {}
        from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum

        on_gpu = torch.cuda.is_available()
        before = torch.cuda.memory_allocated() if on_gpu else 0
        started = time.perf_counter()
        unlink_moment_views(self.engine.optimizer)
        self.engine.offload_states(
            include=[OffloadStateTypeEnum.optim_states, OffloadStateTypeEnum.lp_grads],
            device=OffloadDeviceEnum.cpu,
            pin_memory=on_gpu,
        )
        self.away = True
        metrics = {"update/offload_seconds": time.perf_counter() - started}
        if on_gpu:
            metrics["update/offloaded_gib"] = (before - torch.cuda.memory_allocated()) / GIB
        return metrics

    def bring_back(self) -> dict[str, float]:
        """Before anything reads or steps the states: back on the learner's device; the seconds it took."""
        if not self.away:
            return {}
        started = time.perf_counter()
        self.engine.reload_states()
        link_moment_views(self.engine.optimizer)
        self.away = False
        return {"update/reload_seconds": time.perf_counter() - started}

    @contextlib.contextmanager
    def present(self) -> Iterator[None]:
        """The states on the device for a checkpoint's save or load, then away again: both happen
        between updates, where they belong in host memory. A resume's load is the case that needs it:
        the states were never away there, and the first rollout must not find them on the GPU."""
        self.bring_back()
        try:
            yield
        finally:
            self.send_away()


def unlink_moment_views(optimizer) -> None:
    """Drops each parameter's views of Adam's moments (DeepSpeed's `_hp_mapping.optim_fragment`),
    so that moving the moments frees them, and marks them for linking again."""
    for group in getattr(optimizer, "bit16_groups", []):
        for param in group:
            mapping = getattr(param, "_hp_mapping", None)
            if mapping is not None and mapping.optim_fragment:
                mapping.optim_fragment = {}
    if hasattr(optimizer, "_hp_optimizer_states_linked"):
        optimizer._hp_optimizer_states_linked = False


def link_moment_views(optimizer) -> None:
    """The views again, of the moments now in the optimizer's state (DeepSpeed links them itself
    after a step; a checkpoint's save between updates reads them before any step)."""
    if getattr(optimizer, "_hp_optimizer_states_linked", True) or not optimizer.optimizer.state:
        return
    optimizer._lazy_init_hp_params_optimizer_state()
