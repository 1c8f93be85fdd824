"""learner.offload_states_between_updates (grpo_ray/actors/state_offload.py): a ZeRO-2 learner that
keeps Adam's moments and its gradients in host memory between updates trains exactly as one that
does not, checkpoints while they are away, and resumes from that checkpoint to the same weights.

On a CPU, DeepSpeed's move is a copy into host memory that was host memory already: what this
checks is the bookkeeping (what is away when, and which call brings it back) and that no state is
lost on the way; tests/gpu/test_state_offload_cuda.py runs the same learners on a GPU, where the
GPU memory freed is measured too. Each learner runs in a process of its own (DeepSpeed keeps one
process group a process).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np


from ...conftest import tiny_learner_settings
from ...gpu.test_cuda_paths import ROWS, _batch, whole_batch_shard

AWAY = ["lp_grads", "optim_states"]  # DeepSpeed's names of Adam's moments and the gradients


def run_learners(tmp_path: Path, timeout: float = 600) -> dict[str, dict]:
    """The learner with and without the offload, side by side; what each wrote."""
    runs = {}
    for offload in ("on", "off"):
        out = tmp_path / offload
        runs[offload] = subprocess.Popen(
            [sys.executable, "-m", "tests.unit.actors.test_state_offload", offload, str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=Path(__file__).resolve().parents[3],
        )
    results = {}
    for offload, process in runs.items():
        output, _ = process.communicate(timeout=timeout)
        assert process.returncode == 0, output[-4000:]
        out = tmp_path / offload
        results[offload] = {
            "report": json.loads((out / "report.json").read_text()),
            "params": dict(np.load(out / "params.npz")),
            "resumed": dict(np.load(out / "resumed.npz")),
        }
    return results


def check_offload_trains_as_without(results: dict[str, dict], exact: bool) -> None:
    on, off = results["on"], results["off"]
    for name, value in off["params"].items():
        np.testing.assert_allclose(
            on["params"][name],
            value,
            rtol=0 if exact else 1e-5,
            atol=0 if exact else 1e-6,
            err_msg=f"{name}: the offloading learner trained otherwise",
        )
        # Resumed from a checkpoint saved while the states were away: the third step's weights again.
        np.testing.assert_allclose(
            on["resumed"][name],
            on["params"][name],
            rtol=0 if exact else 1e-5,
            atol=0 if exact else 1e-6,
            err_msg=f"{name} after resume",
        )
    report = on["report"]
    # Away after every update and after a checkpoint's save or load (the load found them on the device);
    # brought back at each update's start.
    assert report["away_after_step"] == [AWAY] * 3
    assert report["away_after_save"] == AWAY and report["away_after_load"] == AWAY
    steps = report["metrics"]
    assert all("update/offload_seconds" in metrics for metrics in steps)
    assert "update/reload_seconds" not in steps[0] and all("update/reload_seconds" in m for m in steps[1:])
    assert off["report"]["away_after_step"] == [[]] * 3
    # DeepSpeed's views of the moments would keep them on the GPU while away (an H100 freed nothing at
    # the first offload): none while away, and linked again to the moments that came back.
    assert [views["count"] for views in report["views_after_step"]] == [0, 0, 0]
    views_back, views_kept = report["views_after_bring_back"], off["report"]["views_after_step"][-1]
    assert views_back["count"] == views_kept["count"] > 0 and views_back["of_held"] and views_kept["of_held"]
    assert not any(key.startswith(("update/offload", "update/reload")) for m in off["report"]["metrics"] for key in m)


def test_a_learner_that_offloads_between_updates_trains_checkpoints_and_resumes_as_one_that_does_not(tmp_path):
    check_offload_trains_as_without(run_learners(tmp_path), exact=True)


def _learner(offload: bool, out: Path) -> None:
    """Three updates (a checkpoint after the second), then a resume from it and the third again."""
    import torch

    from grpo_ray.actors.learner import LearnerWorker
    from grpo_ray.transport.broadcast import free_port

    torch.backends.cuda.matmul.allow_tf32 = False
    settings = tiny_learner_settings(zero_stage=2, grad_accum_steps=2, offload_states_between_updates=offload)
    learner = LearnerWorker(settings, rank=0, world_size=1)
    learner.setup("127.0.0.1", free_port())
    batch = _batch(learner.module.config.vocab_size)

    def step(k: int) -> dict:
        advantages = np.roll(np.linspace(-1, 1, ROWS), k).astype(np.float32)
        return learner.train_step(whole_batch_shard(batch, advantages, step=k), batch).metrics

    def away() -> list[str]:
        return sorted(state.value for state in learner.engine.optimizer.offloaded_states)

    def moment_views() -> dict:
        """DeepSpeed's own views of Adam's moments (each parameter's `_hp_mapping.optim_fragment`):
        how many, and whether each is of the moments the optimizer holds now."""
        optimizer = learner.engine.optimizer
        held = {
            value.untyped_storage().data_ptr()
            for state in optimizer.optimizer.state.values()
            for value in state.values()
            if torch.is_tensor(value) and value.dim() > 0
        }
        params = [param for group in optimizer.bit16_groups for param in group]
        views = [view for param in params for view in (param._hp_mapping.optim_fragment or {}).values()]
        return {"count": len(views), "of_held": all(v.untyped_storage().data_ptr() in held for v in views)}

    report: dict = {"metrics": [], "away_after_step": [], "views_after_step": []}
    for k in (1, 2, 3):
        report["metrics"].append(step(k))
        report["away_after_step"].append(away())
        report["views_after_step"].append(moment_views())
        if k == 2:
            learner.save_checkpoint(str(out / "checkpoint"))
            report["away_after_save"] = away()
    np.savez(out / "params.npz", **learner.parameters_snapshot())
    learner.offload.bring_back()  # as in a resumed run's new learner: the states on the device when it loads
    report["views_after_bring_back"] = moment_views()
    learner.load_checkpoint(str(out / "checkpoint"))
    report["away_after_load"] = away()
    step(3)
    np.savez(out / "resumed.npz", **learner.parameters_snapshot())
    if torch.cuda.is_available():
        report["cuda_allocated_after_step"] = torch.cuda.memory_allocated()
        report["trainable_parameters"] = sum(p.numel() for p in learner.module.parameters() if p.requires_grad)
    (out / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    out = Path(sys.argv[2])
    out.mkdir(parents=True)
    _learner(sys.argv[1] == "on", out)
