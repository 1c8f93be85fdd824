"""sequence_logprobs: the entropy is a metric unless asked to carry gradients."""

import torch

from grpo_ray.models.loading import load_causal_lm, sequence_logprobs
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
