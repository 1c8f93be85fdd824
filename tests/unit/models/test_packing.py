"""packed_completion_logprobs: rows packed end to end give the padded path's log-probs, entropies and
gradients, in float32, under each attention implementation and both LM-head paths."""

import pytest
import torch

from grpo_ray.models.loading import load_causal_lm, sequence_logprobs
from grpo_ray.models.chunked_logprobs import HeadOptions
from grpo_ray.models.packing import check_packable, packed_completion_logprobs
from grpo_ray.models.tiny import ensure_tiny_artifacts


# (prompt, completion) token lists: lengths from 2 to 13, one row without a completion.
ROWS = [
    ([5, 6, 7, 8], [9, 10]),
    ([11, 12], [13, 14, 15, 16, 30, 31, 32, 33, 34, 35, 36]),
    ([5, 6, 7, 8], [17]),
    ([11, 12], []),
    ([23, 24, 25], [26, 27, 28]),
]


def _rows(rows, vocab_offset=0):
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    completion = torch.zeros(ids.shape)
    for row, (p, c) in enumerate(rows):
        ids[row, : len(p) + len(c)] = torch.tensor(p + c) + vocab_offset
        mask[row, : len(p) + len(c)] = 1
        completion[row, len(p) : len(p) + len(c)] = 1
    return ids, mask, completion


def _grads(model):
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return grads


def _compare(model, ids, mask, completion, chunk_tokens):
    """Padded vs packed: values at completion tokens, and the gradients of a loss over both."""
    padded, padded_entropy = sequence_logprobs(
        model, ids, mask, 0.7, with_entropy=True, entropy_grad=True, chunk_tokens=chunk_tokens
    )
    ((padded * completion).sum() + 0.1 * (padded_entropy * completion).sum()).backward()
    expected = _grads(model)
    options = HeadOptions(0.7, with_entropy=True, entropy_grad=True, chunk_tokens=chunk_tokens)
    packed, packed_entropy = packed_completion_logprobs(model, ids, mask, completion, options)
    assert packed.shape == ids.shape and packed_entropy.shape == ids.shape
    # Outside the completions: zero (out of every loss).
    assert not (packed * (1 - completion)).any()
    torch.testing.assert_close(packed * completion, padded * completion, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed_entropy * completion, padded_entropy * completion, rtol=1e-5, atol=1e-5)
    ((packed * completion).sum() + 0.1 * (packed_entropy * completion).sum()).backward()
    for param, want in zip(model.parameters(), expected):
        # float32: rounding moves a gradient by ~1e-6 of its norm; attention leaking across rows, or
        # a log-prob of the wrong position, moves whole tensors.
        assert (param.grad - want).norm() <= 1e-4 * want.norm() + 1e-7
    model.zero_grad()


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("chunk_tokens", [0, 4])
def test_tiny_model_packed_equals_padded(attention, chunk_tokens):
    model = load_causal_lm(str(ensure_tiny_artifacts().model_dir))
    model.config._attn_implementation = attention
    _compare(model, *_rows(ROWS), chunk_tokens)


@pytest.mark.parametrize("chunk_tokens", [0, 8])
def test_qwen2_vocabulary_model_packed_equals_padded(qwen2_vocab_model, chunk_tokens):
    _compare(qwen2_vocab_model, *_rows(ROWS, vocab_offset=150_000), chunk_tokens)


def test_the_model_runs_once_on_the_real_tokens_only():
    model = load_causal_lm(str(ensure_tiny_artifacts().model_dir))
    seen = []
    model.model.embed_tokens.register_forward_hook(lambda module, args, out: seen.append(tuple(args[0].shape)))
    ids, mask, completion = _rows(ROWS)
    with torch.no_grad():
        packed_completion_logprobs(model, ids, mask, completion)
    assert seen == [(1, int(mask.sum()))]  # 42 real tokens, where padded rows would be 5 x 13 = 65


def test_no_completion_tokens_gives_zeros():
    model = load_causal_lm(str(ensure_tiny_artifacts().model_dir))
    ids, mask, completion = _rows([ROWS[3]])
    logprobs, entropy = packed_completion_logprobs(model, ids, mask, completion, HeadOptions(with_entropy=True))
    assert not logprobs.any() and not entropy.any()


def test_an_attention_that_packing_cannot_keep_apart_is_refused():
    model = load_causal_lm(str(ensure_tiny_artifacts().model_dir))
    model.config._attn_implementation = "some_kernel"
    with pytest.raises(ValueError, match="learner.packing: .*'some_kernel'.*set learner.packing: false"):
        check_packable(model)
