"""Token log-probs from liger-kernel's fused linear cross-entropy (learner.logprob_kernel: liger).

The torch chunked path (models.chunked_logprobs) runs the LM head a chunk at a time, but each
chunk's softmax still goes through a handful of separate [chunk, vocab] float32 passes (cast, max,
subtract, exp, sum, gather; as many again in backward). On a GPU those passes, not the head's
matmuls, should be most of the head's time for a small model with Qwen's 152K vocabulary (a
roofline estimate, not yet measured: each pass moves 0.6 MB a token, so ~16 passes take ~3 us a
token at an H100's 3 TB/s, where the 0.5B head's four matmuls (forward, recompute, two gradients)
take ~1.1 us at its bf16 peak). liger-kernel's Triton kernel does the softmax and cross-entropy of
a chunk in one pass over its logits. A token's cross-entropy is minus its log-prob, so with
reduction "none" its per-token loss is what the learner needs.

What it cannot give: the entropy (liger computes none), so a learner on this path logs no
actor/entropy and takes no entropy bonus (config refuses entropy_coef with it).

The one place grpo-ray calls liger-kernel: its version floor and its argument order live here.
0.8.2 is the first release whose per-token ("none") reduction has the right weight gradient (it
folds each token's upstream gradient in before the head's weight gradient; liger #1298).
Triton kernels run on CUDA; tests run the same kernels on a CPU under Triton's interpreter.
"""

from __future__ import annotations

import os
import re

import torch
from torch import Tensor

from grpo_ray.models.lm_head import plain_lm_head

MIN_LIGER_VERSION = (0, 8, 2)


def liger_version_problem(version: str | None) -> str | None:
    """Why liger-kernel `version` (None: not installed) cannot serve log-probs, or None if it can."""
    floor = ".".join(map(str, MIN_LIGER_VERSION))
    if version is None:
        return f"liger-kernel is not installed (pip install 'liger-kernel>={floor}')"
    numbers = tuple(int(part) for part in re.findall(r"\d+", version)[:3])
    if numbers < MIN_LIGER_VERSION:
        return (
            f"liger-kernel {version} is older than {floor}, whose per-token gradients are right "
            "(pip install -U liger-kernel)"
        )
    return None


def installed_liger_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("liger-kernel")
    except PackageNotFoundError:
        return None


def chosen_logprob_kernel(requested: str, model: torch.nn.Module, say: bool) -> str:
    """The LM-head kernel this process uses for `model` (its device, its head) when the recipe asks
    for `requested`; where liger cannot serve, the torch path, said in one line with `say`. A liger
    that is missing or too old on a GPU is an error: the recipe asked for it where it could run."""
    if requested != "liger":
        return requested
    device = next(model.parameters()).device
    # Triton's interpreter (TRITON_INTERPRET=1) runs the kernels on any device, slowly: for tests.
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        reason = f"runs on CUDA devices, and this model is on {device.type}"
    else:
        problem = liger_version_problem(installed_liger_version())
        if problem is not None:
            raise ValueError(f"learner.logprob_kernel: liger: {problem}; or set learner.logprob_kernel: torch")
        if plain_lm_head(model) is not None:
            return "liger"
        reason = (
            "covers a plain linear LM head (qwen2, qwen3, llama, mistral), and this model's is not one "
            "(another architecture, a LoRA-wrapped head or ZeRO-3)"
        )
    if say:
        print(f"learner.logprob_kernel: liger {reason}: log-probs take the torch path", flush=True)
    return "torch"


def liger_token_logprobs(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, target_ids: Tensor, temperature: float
) -> Tensor:
    """Float32 log-prob [M] of each target under softmax((hidden @ weight.T + bias) / temperature);
    hidden [M, H], weight [V, H]. Differentiable w.r.t. hidden, weight and bias, the weight's
    gradient summed in float32 (as the torch path sums it)."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    if temperature <= 0:
        raise ValueError(f"temperature must be positive; got {temperature}")
    if temperature != 1.0:
        # (h W^T + b) / T = (h / T) W^T + b / T: liger has no temperature of its own. In bfloat16,
        # h / T rounds once more than the torch path's float32 division (within bfloat16 tolerance).
        hidden = hidden / temperature
        bias = None if bias is None else bias / temperature
    # Positional (Function.apply takes no keywords): input, weight, target, bias, ce_weight,
    # ignore_index, lse_square_scale, label_smoothing, reduction, softcap, return_z_loss, accum_dtype.
    out = LigerFusedLinearCrossEntropyFunction.apply(
        hidden.contiguous(),
        weight,
        target_ids.contiguous(),
        bias,
        None,
        -100,
        0.0,
        0.0,
        "none",
        None,
        False,
        torch.float32,
    )
    loss = out[0] if isinstance(out, tuple) else out
    return -loss.float()
