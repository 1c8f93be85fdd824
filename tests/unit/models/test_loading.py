"""sequence_logprobs: the entropy is a metric unless asked to carry gradients; prompt columns can be skipped."""

import torch

from grpo_ray.models.loading import first_completion_column, load_causal_lm, sequence_logprobs
from grpo_ray.models.tiny import ensure_tiny_artifacts


def _inputs():
    ids = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]])
    return ids, (ids != 0).long()


def test_entropy_carries_gradients_only_when_asked():
    model = load_causal_lm(str(ensure_tiny_artifacts().model_dir))
    ids, mask = _inputs()
    logprobs, metric = sequence_logprobs(model, ids, mask, 0.9, with_entropy=True)
    assert logprobs.requires_grad and not metric.requires_grad
    _, bonus = sequence_logprobs(model, ids, mask, 0.9, with_entropy=True, entropy_grad=True)
    assert bonus.requires_grad
    torch.testing.assert_close(metric, bonus.detach())
    # Column 0 predicts nothing; later columns are positive entropies below log(vocab).
    assert torch.all(metric[:, 0] == 0) and torch.all(metric[:, 1:] > 0)
    assert torch.all(metric < torch.log(torch.tensor(float(model.config.vocab_size))) + 1e-4)


def test_from_column_gives_the_same_logprobs_and_gradients_after_it_and_zeros_before():
    model = load_causal_lm(str(ensure_tiny_artifacts().model_dir))
    ids, mask = _inputs()
    full, full_entropy = sequence_logprobs(model, ids, mask, 0.7, with_entropy=True)
    (full[:, 3:].sum()).backward()
    full_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    part, part_entropy = sequence_logprobs(model, ids, mask, 0.7, with_entropy=True, from_column=3)
    assert part.shape == full.shape and part_entropy.shape == full_entropy.shape
    assert torch.all(part[:, :3] == 0) and torch.all(part_entropy[:, :3] == 0)
    torch.testing.assert_close(part[:, 3:], full[:, 3:])
    torch.testing.assert_close(part_entropy[:, 3:], full_entropy[:, 3:])
    (part[:, 3:].sum()).backward()
    for got, expected in zip((p.grad for p in model.parameters()), full_grads):
        torch.testing.assert_close(got, expected)


def test_from_column_out_of_range_is_clamped():
    model = load_causal_lm(str(ensure_tiny_artifacts().model_dir))
    ids, mask = _inputs()
    full, _ = sequence_logprobs(model, ids, mask)
    torch.testing.assert_close(sequence_logprobs(model, ids, mask, from_column=0)[0], full)
    last, _ = sequence_logprobs(model, ids, mask, from_column=99)
    assert torch.all(last[:, :-1] == 0)
    torch.testing.assert_close(last[:, -1], full[:, -1])


def test_first_completion_column():
    mask = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 1]], dtype=torch.float32)
    assert first_completion_column(mask) == 2
    assert first_completion_column(torch.zeros(2, 4)) == 1
