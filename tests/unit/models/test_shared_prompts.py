"""completion_logprobs: each distinct prompt runs once, and the results are the full forward's."""

import torch

from grpo_ray.models.loading import load_causal_lm, sequence_logprobs
from grpo_ray.models.shared_prompts import completion_logprobs
from grpo_ray.models.tiny import ensure_tiny_artifacts


def _rows(prompts_and_completions: list[tuple[list[int], list[int]]]):
    """Right-padded (input_ids, attention_mask, completion_mask), as the rollout packs rows."""
    width = max(len(p) + len(c) for p, c in prompts_and_completions)
    ids = torch.zeros((len(prompts_and_completions), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    completion = torch.zeros(ids.shape)
    for row, (p, c) in enumerate(prompts_and_completions):
        ids[row, : len(p) + len(c)] = torch.tensor(p + c)
        mask[row, : len(p) + len(c)] = 1
        completion[row, len(p) : len(p) + len(c)] = 1
    return ids, mask, completion


# Two prompts of different lengths, each with several completions (one empty), and a third alone.
ROWS = [
    ([5, 6, 7, 8], [9, 10]),
    ([11, 12], [13, 14, 15, 16]),
    ([5, 6, 7, 8], [17]),
    ([11, 12], [18, 19]),
    ([5, 6, 7, 8], [20, 21, 22]),
    ([11, 12], []),
    ([23, 24, 25], [26]),
]


def _assert_same_gradients(model, expected_grads):
    """Equal to rounding, in float64 (_model): the two paths differ by at most ~3e-8 of a gradient's
    norm there (the rotary tables stay float32), while a missing contribution would move whole
    tensors. In float32 the same comparison reached 1.2e-5 with AVX-512 kernels (1e-5 with AVX2),
    so it could not be held to even 1e-5 on every CPU."""
    for param, expected in zip(model.parameters(), expected_grads):
        assert (param.grad - expected).norm() <= 1e-6 * expected.norm()


def _model():
    """The tiny model in float64: gradient comparisons then see logic, not the CPU's rounding."""
    return load_causal_lm(str(ensure_tiny_artifacts().model_dir)).double()


def _batch_sizes_seen(model):
    seen = []
    model.model.embed_tokens.register_forward_hook(lambda module, args, out: seen.append(tuple(args[0].shape)))
    return seen


def test_log_probs_entropies_and_gradients_match_the_full_forward():
    model = _model()
    ids, mask, completion = _rows(ROWS)
    full, full_entropy = sequence_logprobs(model, ids, mask, 0.7, with_entropy=True)
    (full * completion).sum().backward()
    full_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    seen = _batch_sizes_seen(model)
    shared, shared_entropy = completion_logprobs(model, ids, mask, completion, 0.7, with_entropy=True)
    # 3 distinct prompts run once (without their last token: widest 3), then all 7 rows carry on
    # from their last prompt token (widest: a 2-token prompt's last token + 4 completion tokens).
    assert seen == [(3, 3), (7, 5)]
    assert shared.shape == full.shape and shared_entropy.shape == full.shape
    torch.testing.assert_close(shared * completion, full * completion)
    torch.testing.assert_close(shared_entropy * completion, full_entropy * completion)
    assert not shared_entropy.requires_grad
    (shared * completion).sum().backward()
    _assert_same_gradients(model, full_grads)


def test_entropy_carries_gradients_when_asked():
    model = _model()
    ids, mask, completion = _rows(ROWS)
    full_entropy = sequence_logprobs(model, ids, mask, with_entropy=True, entropy_grad=True)[1]
    (full_entropy * completion).sum().backward()
    full_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    entropy = completion_logprobs(model, ids, mask, completion, with_entropy=True, entropy_grad=True)[1]
    (entropy * completion).sum().backward()
    _assert_same_gradients(model, full_grads)


def test_without_a_repeated_prompt_or_when_told_not_to_share_it_runs_the_full_forward_once():
    model = load_causal_lm(str(ensure_tiny_artifacts().model_dir))
    seen = _batch_sizes_seen(model)
    ids, mask, completion = _rows([ROWS[0], ROWS[1], ROWS[6]])
    alone, _ = completion_logprobs(model, ids, mask, completion)
    assert seen == [(3, 6)]
    torch.testing.assert_close(alone * completion, sequence_logprobs(model, ids, mask)[0] * completion)
    seen.clear()
    ids, mask, completion = _rows(ROWS)
    completion_logprobs(model, ids, mask, completion, share_prompts=False)
    assert seen == [(7, ids.shape[1])]


def test_a_model_with_sliding_window_layers_runs_the_full_forward_alone():
    # Gemma 3's shape, small: its cache drops keys past the window, so no prefix pass can be shared,
    # and none is run only to be thrown away (it cost Gemma 3 270M a second forward a micro-batch).
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    model = Gemma3ForCausalLM(config).eval()
    seen = _batch_sizes_seen(model)
    ids, mask, completion = _rows(ROWS)
    found, _ = completion_logprobs(model, ids, mask, completion)
    assert seen == [(7, ids.shape[1])]
    torch.testing.assert_close(found * completion, sequence_logprobs(model, ids, mask)[0] * completion)
