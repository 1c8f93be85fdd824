"""Where one update's wall time goes, read off hooks on the model: body, head, embedding gradient,
optimizer. Torch only, so both grpo-ray's venv and TRL's import it (benchmarks/update_split.py).

A timeline of time.perf_counter() marks, the same on both sides:

- `forward`: the model's first forward with gradients on, in a micro-batch (a forward pre-hook on
  the whole causal LM);
- `norm_out`: the final norm's output (its forward hook), i.e. the LM head's input;
- `backward`/`backward_done`: the framework's backward call begins and returns (a wrapper on
  DeepSpeed's engine.backward or accelerate's backward: the one place each side starts autograd);
- `norm_grad`: the gradient reaches the final norm's output (a tensor hook);
- `emb_grad`: the gradient reaches the input embedding's output (a tensor hook);
- `autograd_end`: autograd's pass is over (a callback queued on the engine from the first tensor
  hook), so the framework's own work after it (DeepSpeed's gradient all-reduce at the accumulation
  boundary, even on one rank) is not counted as the embedding's;
- `step`/`step_done`: the optimizer step (with clipping and zero_grad, as each side does it).

Per micro-batch: body forward = norm_out - forward (the last norm output before backward: a
forward whose result is thrown away counts as body), head forward = backward - norm_out (the LM
head, the log-softmax and the loss), head backward = norm_grad - backward (with the head's weight
gradient), body backward = emb_grad - norm_grad, embedding gradient = autograd_end - emb_grad
(the dense [vocab, hidden] gradient of the input embedding, summed with the head's into the tied
weight and accumulated into .grad), backward epilogue = backward_done - autograd_end (the
framework's work after autograd). What the update spends outside these is `other`.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch

# The rows of the table, in order.
PHASES = (
    "body forward",
    "head forward",
    "head backward",
    "body backward",
    "embedding gradient",
    "backward epilogue",
    "optimizer",
    "other",
    "total",
)


class PhaseClock:
    """Marks on a timeline from hooks on `model` (the causal LM), its final `norm` and its input
    `embedding`; `wrap` adds the marks of a framework's backward and optimizer calls."""

    def __init__(self, model: torch.nn.Module, norm: torch.nn.Module, embedding: torch.nn.Module):
        self.marks: list[tuple[str, float]] = []
        self._queued = False
        self.handles = [
            model.register_forward_pre_hook(self._model_forward),
            norm.register_forward_hook(self._norm_forward),
            embedding.register_forward_hook(self._embedding_forward),
        ]

    def mark(self, name: str) -> None:
        self.marks.append((name, time.perf_counter()))

    def wrap(self, owner, attribute: str, name: str) -> None:
        """Mark `name` and `name`_done around every call of owner.attribute (an instance's method)."""
        method = getattr(owner, attribute)

        @functools.wraps(method)
        def timed(*args, **kwargs):
            self.mark(name)
            try:
                return method(*args, **kwargs)
            finally:
                self.mark(f"{name}_done")

        setattr(owner, attribute, timed)

    def _model_forward(self, _module, _args):
        if torch.is_grad_enabled():
            self.mark("forward")

    def _norm_forward(self, _module, _args, out):
        if torch.is_grad_enabled() and out.requires_grad:
            self.mark("norm_out")
            out.register_hook(self._norm_grad)

    def _embedding_forward(self, _module, _args, out):
        if torch.is_grad_enabled() and out.requires_grad:
            out.register_hook(self._embedding_grad)

    def _norm_grad(self, grad):
        self.mark("norm_grad")
        if not self._queued:  # once per backward: the end of autograd's whole pass
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._autograd_end)
        return grad

    def _embedding_grad(self, grad):
        self.mark("emb_grad")
        return grad

    def _autograd_end(self):
        self._queued = False
        self.mark("autograd_end")

    def take(self) -> list[tuple[str, float]]:
        marks, self.marks = self.marks, []
        return marks


def split_update(marks: list[tuple[str, float]], started: float, finished: float) -> dict:
    """Seconds per phase of one update whose marks are `marks`, timed from `started` to `finished`;
    with `micro_batches` and `forwards` (model forwards with gradients, per micro-batch)."""
    seconds = dict.fromkeys(PHASES, 0.0)
    seen: dict[str, float] = {}
    forwards = []
    count = 0
    for name, at in marks:
        if name == "forward":
            count += 1
            seen.setdefault("forward", at)
        elif name in ("norm_out", "autograd_end", "backward_done", "step"):
            seen[name] = at  # the last one counts
        elif name in ("backward", "norm_grad", "emb_grad"):
            seen.setdefault(name, at)  # the first one counts
        elif name == "step_done":
            seconds["optimizer"] += at - seen.pop("step")
        if name == "backward_done":
            s = seen
            seconds["body forward"] += s["norm_out"] - s["forward"]
            seconds["head forward"] += s["backward"] - s["norm_out"]
            seconds["head backward"] += s["norm_grad"] - s["backward"]
            seconds["body backward"] += s["emb_grad"] - s["norm_grad"]
            seconds["embedding gradient"] += s["autograd_end"] - s["emb_grad"]
            seconds["backward epilogue"] += s["backward_done"] - s["autograd_end"]
            forwards.append(count)
            seen, count = {}, 0
    seconds["total"] = finished - started
    seconds["other"] = seconds["total"] - sum(seconds[p] for p in PHASES if p not in ("other", "total"))
    return {"seconds": seconds, "micro_batches": len(forwards), "forwards": forwards}


def medians(updates: list[dict]) -> dict[str, float]:
    """The median over updates of each phase's seconds."""
    return {phase: statistics.median(u["seconds"][phase] for u in updates) for phase in PHASES}


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports ru_maxrss in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(clock: PhaseClock, update, warmup: int, repeats: int) -> list[dict]:
    """`warmup` + `repeats` calls of update() (one whole update each), split by `clock`'s marks; the
    measured ones' splits."""
    updates = []
    for index in range(warmup + repeats):
        clock.take()
        started = time.perf_counter()
        update()
        finished = time.perf_counter()
        split = split_update(clock.take(), started, finished)
        if index >= warmup:
            updates.append(split)
        print(f"update {index + 1}/{warmup + repeats}: {finished - started:.2f} s", flush=True)
    return updates
