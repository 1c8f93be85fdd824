"""draw_tokens / inverse_cdf: exact draws from softmax(scores), one uniform per row."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from grpo_ray.models.sampling import BLOCK, draw_tokens, inverse_cdf


def test_inverse_cdf_hand_worked():
    # probs [0, 0.25, 0, 0.75]: cumulative [0, 0.25, 0.25, 1]; the first index whose cumulative
    # weight exceeds u: u=0 -> 1 (never the zero-weight index 0), 0.2 -> 1, 0.25 -> 3, 0.9 -> 3,
    # and u just below 1 -> 3. Unnormalised weights (x4) give the same indices.
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75]]).repeat(5, 1)
    u = torch.tensor([0.0, 0.2, 0.25, 0.9, 1 - 1e-16], dtype=torch.float64)
    assert inverse_cdf(probs, u).tolist() == [1, 1, 3, 3, 3]
    assert inverse_cdf(probs * 4, u).tolist() == [1, 1, 3, 3, 3]


def test_inverse_cdf_across_blocks_never_draws_zero_weight_tokens():
    # Weight only on the last token of block 0, the first of block 2 and the very last token:
    # cumulative 0.5 / 0.75 / 1 at those places, zero weight everywhere between them.
    vocab = 2 * BLOCK + 37
    probs = torch.zeros(4, vocab)
    probs[:, BLOCK - 1], probs[:, 2 * BLOCK], probs[:, -1] = 0.5, 0.25, 0.25
    u = torch.tensor([0.0, 0.5, 0.74, 0.999999], dtype=torch.float64)
    assert inverse_cdf(probs, u).tolist() == [BLOCK - 1, 2 * BLOCK, 2 * BLOCK, vocab - 1]
    many = inverse_cdf(probs.repeat(2000, 1)[:4000], torch.rand(4000, dtype=torch.float64))
    assert set(many.tolist()) == {BLOCK - 1, 2 * BLOCK, vocab - 1}


@pytest.mark.parametrize("vocab", [6, 3 * BLOCK + 5])
def test_draws_follow_softmax_chi_square(vocab):
    # 60,000 rows of the same scores, one draw each; a chi-square goodness-of-fit test against
    # softmax(scores) at the 0.1% level. Scores with -inf (top-k style masking) among them. With a
    # large vocabulary the mass is put on 6 tokens spread over different blocks, the rest ~0.
    scores = torch.full((vocab,), -math.inf)
    places = torch.linspace(0, vocab - 1, 6).long()
    scores[places] = torch.tensor([0.3, -1.0, 2.0, 0.0, 1.1, -0.4])
    if vocab > 6:
        scores[torch.arange(1, vocab, 7)] = -30.0  # tiny but positive weight, mostly never drawn
    rows = 60_000
    gen = torch.Generator().manual_seed(0)
    tokens, logprobs = draw_tokens(scores.expand(rows, vocab), gen)
    expected = torch.softmax(scores.double(), -1)
    counts = np.bincount(tokens.numpy(), minlength=vocab)[places.numpy()]
    assert counts.sum() >= rows - 5  # everything else together has weight ~1e-10 * vocab
    _, p_value = stats.chisquare(counts, expected[places].numpy() * counts.sum() / expected[places].sum().item())
    assert p_value > 1e-3
    torch.testing.assert_close(logprobs, torch.log_softmax(scores, -1)[tokens])


def test_fixed_seed_same_draws_other_seed_other_draws_greedy_the_argmax():
    scores = torch.randn(64, 5000, generator=torch.Generator().manual_seed(1))
    first = draw_tokens(scores, torch.Generator().manual_seed(7))
    again = draw_tokens(scores, torch.Generator().manual_seed(7))
    other = draw_tokens(scores, torch.Generator().manual_seed(8))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])
    greedy, greedy_lp = draw_tokens(scores, None)
    assert torch.equal(greedy, scores.argmax(-1))
    torch.testing.assert_close(greedy_lp, torch.log_softmax(scores, -1).max(-1).values)
