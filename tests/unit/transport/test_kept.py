import pytest
import torch

from grpo_ray.transport.kept import KeptWeights


def test_the_tensors_pass_through_and_a_copy_of_each_is_kept_as_it_was():
    kept = KeptWeights()
    weights = [torch.ones(2), torch.zeros(3)]
    passed = list(kept.keeping(4, iter(weights), keep=1))
    assert passed[0] is weights[0] and passed[1] is weights[1]
    weights[0].add_(1.0)  # the optimizer moves on; the copy is what was sent
    assert torch.equal(kept.tensors(4)[0], torch.ones(2)) and torch.equal(kept.tensors(4)[1], torch.zeros(3))


def test_only_the_newest_versions_stay_and_a_missing_one_is_named():
    kept = KeptWeights()
    for version in range(4):
        list(kept.keeping(version, [torch.full((1,), float(version))], keep=2))
    assert kept.versions == [2, 3]
    with pytest.raises(KeyError, match="weights version 1 is not kept"):
        kept.tensors(1)


def test_a_consumer_that_stops_at_the_last_tensor_still_leaves_it_kept():
    # send_buckets takes exactly as many tensors as the buckets hold and never asks for the end.
    kept = KeptWeights()
    stream = kept.keeping(7, [torch.ones(1), torch.ones(1)], keep=1)
    next(stream), next(stream)
    assert len(kept.tensors(7)) == 2
