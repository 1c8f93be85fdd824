"""Token log-probs and entropies from the model's last hidden state and its LM head, a chunk of
tokens at a time, never the whole [tokens, vocab] logits.

Over Qwen's 151,936-token vocabulary the logits, their float32 copy, the softmax for the entropy
and the gradients of all three are the largest tensors of a learner step (a 0.5B model at 16 x 1k
tokens: ~10 GB each in float32). Here the LM head runs on `chunk_tokens` positions at a time:
forward keeps only each position's log-sum-exp and entropy, and backward recomputes the chunk's
logits from the saved hidden states and writes the gradients of the hidden states and of the LM
head weight chunk by chunk. Peak extra memory is a few [chunk, vocab] float32 tensors whatever the
batch, and the numbers are today's to float rounding: logits in the model's dtype, then float32,
divided by the sampling temperature, as `token_logprobs_from_logits` and `entropy_from_logits`
compute them.

Models whose logits are not plain lm_head(last hidden state) (Gemma's soft-capping, Cohere's
logit scale, ...), a LoRA-wrapped LM head and ZeRO-3 (whose LM head weight is partitioned outside
its module's forward) take the full-logits path instead: same results, no saving.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from grpo_ray.algo import entropy_from_logits, token_logprobs_from_logits
from grpo_ray.models.lm_head import plain_lm_head


@dataclass(frozen=True)
class HeadOptions:
    """How the LM head's outputs become log-probs: logits divided by the sampling `temperature`;
    entropies too with `with_entropy`, differentiable only with `entropy_grad` (an entropy bonus);
    `chunk_tokens` positions at a time (0 with the torch kernel: the full logits); `kernel` "torch",
    or "liger" (liger-kernel's fused head, models.liger_logprobs; log-probs only)."""

    temperature: float = 1.0
    with_entropy: bool = False
    entropy_grad: bool = False
    chunk_tokens: int = 0
    kernel: str = "torch"


def head_logprobs(
    model: torch.nn.Module, forward: dict, target_ids: Tensor, options: HeadOptions
) -> tuple[Tensor, Tensor | None]:
    """Run `model(**forward)` and return the log-probs [N, L] (and entropies with `with_entropy`)
    of `target_ids` [N, L], position j of the output predicting target j (the output's last
    position predicts nothing). The one place both the learner and the reference turn a forward
    into log-probs. The full logits where `options` ask for no chunking or `plain_lm_head` refuses
    the model."""
    head = _head_for(model, options)
    if head is None:
        return _logits_stats(model(**forward).logits[:, :-1], target_ids, options)
    rows, width = target_ids.shape
    # The decoder ran on every position (logits_to_keep only trims the head): keep those the head would have.
    hidden = last_hidden_state(model, forward)[:, -(width + 1) : -1]
    flat = hidden.reshape(rows * width, hidden.shape[-1])
    logprobs, entropy = _head_stats(head, flat, target_ids.reshape(-1), options)
    return logprobs.view(rows, width), (None if entropy is None else entropy.view(rows, width))


def logprobs_at(
    model: torch.nn.Module, forward: dict, positions: Tensor, target_ids: Tensor, options: HeadOptions
) -> tuple[Tensor, Tensor | None]:
    """head_logprobs for a one-row forward (a packed micro-batch): the log-probs [M] (and entropies)
    of `target_ids` [M], predicted by the outputs at `positions` [M]. The LM head runs on those
    positions only (Hugging Face's logits_to_keep takes an index tensor), chunked as head_logprobs."""
    head = _head_for(model, options)
    if head is None:
        return _logits_stats(model(**forward, logits_to_keep=positions).logits[0], target_ids, options)
    hidden = last_hidden_state(model, forward)[0, positions]
    return _head_stats(head, hidden, target_ids, options)


def _head_for(model: torch.nn.Module, options: HeadOptions) -> torch.nn.Linear | None:
    """The LM head to run apart from the model, or None for the full-logits path."""
    if options.kernel not in ("torch", "liger"):
        raise ValueError(f"learner.logprob_kernel: {options.kernel!r} is not one of torch, liger")
    return plain_lm_head(model) if options.chunk_tokens > 0 or options.kernel == "liger" else None


def _head_stats(
    head: torch.nn.Linear, hidden: Tensor, target_ids: Tensor, options: HeadOptions
) -> tuple[Tensor, Tensor | None]:
    """The chunked path on hidden states [M, H]: log-probs [M] (and entropies), by liger's fused
    kernel with `kernel` "liger" (log-probs only)."""
    if options.kernel == "liger":
        if options.with_entropy:
            raise ValueError("learner.logprob_kernel: liger computes no entropy; ask for log-probs only")
        from grpo_ray.models.liger_logprobs import liger_token_logprobs

        return liger_token_logprobs(hidden, head.weight, head.bias, target_ids, options.temperature), None
    logprobs, entropy = chunked_token_stats(
        hidden, head.weight, head.bias, target_ids, options.temperature, options.chunk_tokens, options.with_entropy
    )
    if entropy is not None and not (options.entropy_grad and torch.is_grad_enabled()):
        entropy = entropy.detach()
    return logprobs, entropy


def _logits_stats(logits: Tensor, target_ids: Tensor, options: HeadOptions) -> tuple[Tensor, Tensor | None]:
    """The full-logits path: log-probs of `target_ids` (and entropies) from logits made float32."""
    logits = logits.float()
    logprobs = token_logprobs_from_logits(logits, target_ids, temperature=options.temperature)
    entropy = None
    if options.with_entropy:
        with torch.set_grad_enabled(options.entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits, options.temperature)
    return logprobs, entropy


def last_hidden_state(model: torch.nn.Module, forward: dict) -> Tensor:
    """The decoder's output for `forward`, taken by a hook while the whole model runs (through the
    DeepSpeed engine and peft as usual) with its LM head on one position only."""
    module = getattr(model, "module", model)
    captured: list[Tensor] = []

    def keep(_module, _args, out):
        captured.append(out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0])

    handle = module.get_decoder().register_forward_hook(keep)
    try:
        model(**{**forward, "logits_to_keep": 1})
    finally:
        handle.remove()
    return captured[-1]


def chunked_token_stats(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target_ids: Tensor,
    temperature: float,
    chunk_tokens: int,
    with_entropy: bool,
) -> tuple[Tensor, Tensor | None]:
    """Float32 (float64 for float64 inputs) log-prob [M] of each target under
    softmax((hidden @ weight.T + bias) / temperature), and the entropy [M] of that distribution with
    `with_entropy`; hidden [M, H], weight [V, H]. Differentiable w.r.t. hidden, weight and bias."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive; got {temperature}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1; got {chunk_tokens}")
    logprobs, entropy = _ChunkedHead.apply(
        hidden, weight, bias, target_ids, float(temperature), int(chunk_tokens), with_entropy
    )
    return logprobs, (entropy if with_entropy else None)


def _chunk_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    # In the model's dtype, then float32 (float64 stays), as the model's LM head and `.float()` do.
    logits = torch.nn.functional.linear(hidden, weight, bias)
    scaled = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return scaled if temperature == 1.0 else scaled.div_(temperature)


class _ChunkedHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, target_ids, temperature, chunk, with_entropy):
        total = hidden.shape[0]
        lse = hidden.new_empty(total, dtype=torch.promote_types(hidden.dtype, torch.float32))
        logprobs = torch.empty_like(lse)
        entropy = torch.zeros_like(lse)
        for start in range(0, total, chunk):
            part = slice(start, start + chunk)
            # d = z - max(z) in place, e = exp(d): one exp pass serves the log-sum-exp and the
            # entropy (torch.logsumexp would make two [chunk, vocab] temporaries of its own).
            shifted = _chunk_logits(hidden[part], weight, bias, temperature)
            top = shifted.amax(dim=-1, keepdim=True)
            shifted.sub_(top)
            exps = shifted.exp()
            total = exps.sum(dim=-1)
            lse[part] = top.squeeze(-1) + total.log()
            # log p_y = z_y - lse = d_y - log sum e.
            logprobs[part] = shifted.gather(-1, target_ids[part, None]).squeeze(-1) - total.log()
            if with_entropy:
                # H = lse - sum_v p_v z_v (entropy_from_logits' formula) = log sum e - sum_v p_v d_v.
                entropy[part] = total.log() - torch.einsum("mv,mv->m", exps, shifted) / total
        ctx.save_for_backward(hidden, weight, bias, target_ids, lse, entropy)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.set_materialize_grads(False)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, target_ids, lse, entropy = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        # Summed over chunks in float32, cast once at the end (a bfloat16 running sum would round
        # at every chunk where the full path rounds once).
        summed = lse.dtype
        grad_weight = torch.zeros(weight.shape, dtype=summed, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=summed, device=bias.device) if need_bias else None
        if grad_logprobs is None and grad_entropy is None:
            return grad_hidden, _cast(grad_weight, weight), _cast(grad_bias, bias), None, None, None, None
        for start in range(0, hidden.shape[0], chunk):
            part = slice(start, start + chunk)
            grad_scaled = _grad_scaled(
                _chunk_logits(hidden[part], weight, bias, temperature),
                lse[part],
                entropy[part],
                target_ids[part],
                None if grad_logprobs is None else grad_logprobs[part],
                None if grad_entropy is None else grad_entropy[part],
            )
            # d scaled / d logits = 1 / temperature; then back to the dtype the logits had.
            grad_logits = (grad_scaled if temperature == 1.0 else grad_scaled.div_(temperature)).to(weight.dtype)
            if need_hidden:
                grad_hidden[part] = grad_logits @ weight
            if need_weight and weight.dtype == summed:
                grad_weight.addmm_(grad_logits.t(), hidden[part])
            elif need_weight:
                grad_weight += (grad_logits.t() @ hidden[part]).to(summed)
            if need_bias:
                grad_bias += grad_logits.to(summed).sum(0)
        return grad_hidden, _cast(grad_weight, weight), _cast(grad_bias, bias), None, None, None, None


def _grad_scaled(scaled: Tensor, lse: Tensor, entropy: Tensor, target_ids: Tensor, grad_lp, grad_ent) -> Tensor:
    """d loss / d scaled logits [C, V], overwriting `scaled`.

    With s the scaled logits, p = softmax(s) and log p = s - lse:
      d log p_y / d s_v = [v = y] - p_v
      d H / d s_v = -p_v (log p_v + H)      (H = -sum p log p)
    so the gradient is -p_v (g_lp + g_H (s_v - lse + H)) plus g_lp at v = y.
    """
    log_probs = scaled.sub_(lse[:, None])  # in place: s is not needed after this
    probs = log_probs.exp()
    if grad_ent is None:
        grad = probs.mul_(-grad_lp[:, None])
    else:
        # (log p + H) * g_H + g_lp, in place over log p.
        factor = log_probs.add_(entropy[:, None]).mul_(grad_ent[:, None])
        if grad_lp is not None:
            factor.add_(grad_lp[:, None])
        grad = probs.mul_(factor).neg_()
    if grad_lp is not None:
        grad.scatter_add_(-1, target_ids[:, None], grad_lp[:, None].to(grad.dtype))
    return grad


def _cast(grad: Tensor | None, like: Tensor | None) -> Tensor | None:
    return None if grad is None else grad.to(like.dtype)
