"""Completion log-probs of a micro-batch packed end to end: no compute goes to padding.

Rows arrive right-padded [N, T] (types.RolloutSlice). Here their real tokens are laid one after
another in a single row [1, sum of lengths] with position ids restarting at 0 for every sequence,
and the model runs once on that. Hugging Face reads restarting position ids as packed sequences
(transformers.masking_utils.find_packed_sequence_indices, when no attention mask and no cache are
given) and keeps attention within each sequence: a block-causal mask under SDPA and eager, varlen
kernels under flash-attention. So each token sees exactly the tokens it sees in its padded row,
and log-probs, entropies and gradients are the padded path's to float rounding
(tests/unit/models/test_packing.py checks that for every attention implementation it is used with).

The LM head runs only at the positions that predict a completion token (logits_to_keep with an
index tensor), chunked as the padded path is (models.chunked_logprobs). The values come back in
the rows' own [N, T] columns; columns outside a row's completion are 0 and out of every loss.
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from grpo_ray.models.chunked_logprobs import HeadOptions, logprobs_at
from grpo_ray.models.loading import prompt_lengths
from grpo_ray.models.shared_prompts import completion_logprobs

# Attention implementations whose packed-sequence handling the tests check.
PACKABLE_ATTENTION = frozenset({"sdpa", "eager", "flash_attention_2", "flash_attention_3"})


def packed_completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    options: HeadOptions = HeadOptions(),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs [N, T] (and entropies with `options.with_entropy`) at each row's completion
    columns, as shared_prompts.completion_logprobs computes them, with the rows packed."""
    check_packable(model)
    device = next(model.parameters()).device
    input_ids, attention_mask, completion_mask = (
        input_ids.to(device),
        attention_mask.to(device),
        completion_mask.to(device),
    )
    real = attention_mask.bool()
    lengths = attention_mask.sum(dim=1)
    starts = torch.cumsum(lengths, dim=0) - lengths  # where each row begins in the packed row
    columns = torch.arange(input_ids.shape[1], device=device)
    # Column t of a row is predicted by the output at column t - 1: from the row's first completion
    # column (at least 1) to its last real token.
    first = prompt_lengths(completion_mask, lengths).clamp(min=1)
    wanted = real & (columns >= first[:, None])
    rows, cols = wanted.nonzero(as_tuple=True)
    out_shape = input_ids.shape
    if len(rows) == 0:
        zeros = torch.zeros(out_shape, device=device)
        return zeros, (zeros.clone() if options.with_entropy else None)
    forward = dict(
        input_ids=input_ids[real][None],
        position_ids=(attention_mask.cumsum(dim=1) - 1)[real][None],
        use_cache=False,  # with a cache (or a mask) Hugging Face would not read the rows as packed
    )
    logprobs, entropy = logprobs_at(model, forward, starts[rows] + cols - 1, input_ids[rows, cols], options)

    def place(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(out_shape).index_put((rows, cols), values)

    return place(logprobs), (None if entropy is None else place(entropy))


def check_packable(model: torch.nn.Module) -> None:
    """Refuse, in one line, a model whose attention would not keep packed sequences apart."""
    module = getattr(model, "module", model)  # a DeepSpeed engine wraps the model
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
    if implementation not in PACKABLE_ATTENTION:
        raise ValueError(
            f"learner.packing: the model's attention implementation {implementation!r} is not one packing "
            f"keeps within each sequence ({', '.join(sorted(PACKABLE_ATTENTION))}); set learner.packing: false"
        )


def micro_batch_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float,
    *,
    packing: bool,
    share_prompts: bool,
    chunk_tokens: int,
    kernel: str = "torch",
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The learner's and the reference's one choice of forward for a micro-batch: packed
    (learner.packing), else padded with each distinct prompt run once (learner.share_prompts);
    the LM head as `chunk_tokens` and `kernel` say (learner.logprob_chunk_tokens, logprob_kernel)."""
    options = HeadOptions(temperature, with_entropy, entropy_grad, chunk_tokens, kernel)
    if packing:
        return packed_completion_logprobs(model, input_ids, attention_mask, completion_mask, options)
    return completion_logprobs(
        model, input_ids, attention_mask, completion_mask, share_prompts=share_prompts, **asdict(options)
    )
