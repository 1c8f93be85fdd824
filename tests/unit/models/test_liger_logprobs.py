"""learner.logprob_kernel: liger gives the torch path's log-probs and gradients.

liger-kernel's kernels are Triton; on a CPU-only machine they run under Triton's interpreter
(TRITON_INTERPRET=1, which must be set before Triton is imported), so the comparisons run in a
child Python of this environment with it set. The same kernels compiled for a GPU:
tests/gpu/test_liger_cuda.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_ray.models.chunked_logprobs import HeadOptions, chunked_token_stats, head_logprobs
from grpo_ray.models.liger_logprobs import chosen_logprob_kernel, liger_version_problem
from grpo_ray.models.loading import load_causal_lm
from grpo_ray.models.tiny import ensure_tiny_artifacts

from ...conftest import random_qwen2, tiny_learner_settings
from ...gpu.test_cuda_paths import ROWS, _batch, whole_batch_shard

LR = 1e-4


@pytest.mark.parametrize(
    "version, refused",
    [
        (None, "not installed"),
        ("0.8.1", "older than 0.8.2"),
        ("0.6.5", "older"),
        ("0.8.2", None),
        ("0.8.5", None),
        ("0.10.0", None),
        ("1.0.0.dev3", None),
    ],
)
def test_liger_versions_without_right_per_token_gradients_are_refused(version, refused):
    problem = liger_version_problem(version)
    assert (problem is None) if refused is None else (refused in problem)


def test_on_a_cpu_the_torch_path_runs_and_says_so(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = load_causal_lm(str(ensure_tiny_artifacts().model_dir))
    assert chosen_logprob_kernel("liger", model, say=True) == "torch"
    assert capsys.readouterr().out.strip() == (
        "learner.logprob_kernel: liger runs on CUDA devices, and this model is on cpu: log-probs take the torch path"
    )
    assert chosen_logprob_kernel("torch", model, say=True) == "torch"
    assert capsys.readouterr().out == ""


def test_an_unknown_kernel_or_liger_with_entropy_is_refused():
    model = load_causal_lm(str(ensure_tiny_artifacts().model_dir))
    forward = {"input_ids": torch.tensor([[5, 6, 7]])}
    with pytest.raises(ValueError, match="learner.logprob_kernel: 'triton' is not one of torch, liger"):
        head_logprobs(model, forward, torch.tensor([[6, 7]]), HeadOptions(kernel="triton"))
    with pytest.raises(ValueError, match="liger computes no entropy"):
        head_logprobs(model, forward, torch.tensor([[6, 7]]), HeadOptions(with_entropy=True, kernel="liger"))


def _interpreted(*args, timeout=600) -> str:
    """This file's __main__ in a child with Triton's interpreter on; its stdout."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    # As a module of the tests' namespace package, so that it imports test_packing's rows.
    done = subprocess.run(
        [sys.executable, "-m", "tests.unit.models.test_liger_logprobs", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_liger_equals_torch_under_the_triton_interpreter():
    assert "interpreted checks passed: 3" in _interpreted("checks")


def test_a_learner_step_with_liger_equals_the_torch_step(tmp_path):
    """One learner step (DeepSpeed, packed micro-batches) with each kernel, each in its own process
    (DeepSpeed keeps one process group a process): the same update, and no entropy metric from liger."""
    for kernel in ("torch", "liger"):
        _interpreted("learner", kernel, str(tmp_path / kernel))
    after = {kernel: dict(np.load(tmp_path / kernel / "params.npz")) for kernel in ("torch", "liger")}
    metrics = {kernel: json.loads((tmp_path / kernel / "metrics.json").read_text()) for kernel in ("torch", "liger")}
    assert "actor/entropy" in metrics["torch"] and "actor/entropy" not in metrics["liger"]
    assert metrics["liger"]["loss/total"] == pytest.approx(metrics["torch"]["loss/total"], rel=1e-5, abs=1e-7)
    # AdamW's first step moves each weight by ~lr * sign(gradient): equal gradients, equal steps.
    diffs = np.concatenate([np.abs(after["liger"][name] - after["torch"][name]).ravel() for name in after["torch"]])
    moved = np.concatenate(
        [np.abs(after["torch"][name] - metrics["torch"]["before"][name]).ravel() for name in ("model.norm.weight",)]
    )
    assert moved.max() > 0.5 * LR, "the step must move the weights for the comparison to mean anything"
    assert diffs.max() <= 2.5 * LR and (diffs < 0.05 * LR).mean() > 0.999, f"worst {diffs.max():.2e}"


# -- run in the child, under TRITON_INTERPRET=1 ------------------------------------------------------


def _grads(model):
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    return grads


def _close(got, want, what):
    # float32 throughout: both compute log-sum-exps of the same logits, in another order.
    err = (got - want).norm() / (want.norm() + 1e-12)
    assert err <= 1e-5, f"{what}: relative error {err:.2e}"


def _hidden_level():
    """Log-probs, and gradients of hidden, weight and bias, with and without a temperature."""
    gen = torch.Generator().manual_seed(0)
    for temperature in (1.0, 0.7):
        hidden = torch.randn(37, 24, generator=gen, requires_grad=True)
        weight = torch.randn(300, 24, generator=gen, requires_grad=True)
        bias = torch.randn(300, generator=gen, requires_grad=True)
        targets = torch.randint(0, 300, (37,), generator=gen)
        upstream = torch.randn(37, generator=gen)
        want, _ = chunked_token_stats(hidden, weight, bias, targets, temperature, 8, False)
        (want * upstream).sum().backward()
        expected = [t.grad.clone() for t in (hidden, weight, bias)]
        for t in (hidden, weight, bias):
            t.grad = None
        from grpo_ray.models.liger_logprobs import liger_token_logprobs

        got = liger_token_logprobs(hidden, weight, bias, targets, temperature)
        assert got.dtype == torch.float32 and got.shape == (37,)
        _close(got, want, f"log-probs at temperature {temperature}")
        (got * upstream).sum().backward()
        for name, t, grad in zip(("hidden", "weight", "bias"), (hidden, weight, bias), expected):
            _close(t.grad, grad, f"{name} gradient at temperature {temperature}")


def _model_level(model, rows, vocab_offset):
    """The learner's forwards (padded with shared prompts, padded, packed): liger vs torch on the
    same model, values at completion tokens and every parameter's gradient (a tied head included)."""
    from grpo_ray.models.packing import micro_batch_logprobs

    from .test_packing import _rows

    ids, mask, completion = _rows(rows, vocab_offset)
    width = ids.shape[1]
    for packing, share in ((False, True), (False, False), (True, False)):
        results = {}
        for kernel in ("torch", "liger"):
            logprobs, entropy = micro_batch_logprobs(
                model, ids, mask, completion, 0.8, packing=packing, share_prompts=share, chunk_tokens=4, kernel=kernel
            )
            assert entropy is None
            (logprobs * completion * torch.linspace(-1, 1, width)).sum().backward()
            results[kernel] = (logprobs * completion, _grads(model))
        what = f"packing={packing} share_prompts={share}"
        _close(results["liger"][0], results["torch"][0], f"log-probs, {what}")
        assert len(results["liger"][1]) == len(results["torch"][1])
        for got, want in zip(results["liger"][1], results["torch"][1]):
            _close(got, want, f"a gradient, {what}")


def _learner_step(kernel: str, out: str):
    """One learner step with `kernel`; its parameters and metrics (and a norm weight before) to `out`."""
    from pathlib import Path

    from grpo_ray.actors.learner import LearnerWorker
    from grpo_ray.transport.broadcast import free_port

    batch = _batch(50)
    shard = whole_batch_shard(batch, np.linspace(-1, 1, ROWS).astype(np.float32), temperature=0.9)
    settings = tiny_learner_settings(
        grad_accum_steps=2, lr=LR, grad_clip=1e9, logprob_chunk_tokens=16, packing=True, logprob_kernel=kernel
    )
    learner = LearnerWorker(settings, rank=0, world_size=1)
    learner.setup("127.0.0.1", free_port())
    assert learner.logprob_kernel == kernel
    before = learner.parameters_snapshot()["model.norm.weight"]
    metrics = learner.train_step(shard, batch).metrics
    Path(out).mkdir(parents=True)
    np.savez(Path(out) / "params.npz", **learner.parameters_snapshot())
    (Path(out) / "metrics.json").write_text(json.dumps({**metrics, "before": {"model.norm.weight": before.tolist()}}))


def _interpreted_checks():
    rows = [([5, 6, 7, 8], [9, 10]), ([11, 12], [13, 14, 15, 16, 30, 31, 32]), ([5, 6, 7, 8], [17]), ([11, 12], [])]
    _hidden_level()
    _model_level(load_causal_lm(str(ensure_tiny_artifacts().model_dir)), rows, 0)
    _model_level(random_qwen2(), rows, 150_000)
    print("interpreted checks passed: 3")


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run by test_liger_equals_torch_under_the_triton_interpreter"
    if sys.argv[1] == "checks":
        _interpreted_checks()
    else:
        _learner_step(*sys.argv[2:])
