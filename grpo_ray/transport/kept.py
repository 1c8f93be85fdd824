"""Copies of the weights a learner sent, kept for a pipelined run's recovery (rollout.max_staleness > 0).

A batch started ahead was sampled by weights the learner has since updated. When the rollout worker
that held part of it dies, its share must be sampled again by those same weights, or the run is not
the run an unhurt run would have been. So while sending version v, rank 0 keeps a CPU copy of each
tensor it sends; the newest `keep` versions stay (a batch is at most max_staleness updates old).

    kept = KeptWeights()
    send_buckets(group, kept.keeping(version, tensors, keep=1), specs, buckets)   # a sync
    send_buckets(group, iter(kept.tensors(version)), specs, buckets)             # version again
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

import torch


class KeptWeights:
    def __init__(self) -> None:
        self._versions: OrderedDict[int, list[torch.Tensor]] = OrderedDict()

    def keeping(self, version: int, tensors: Iterable[torch.Tensor], keep: int) -> Iterator[torch.Tensor]:
        """Pass `tensors` through, keeping a CPU copy of each as version `version`; only the newest
        `keep` versions stay. Copied as they pass: under ZeRO-3 a tensor is whole only then."""
        copies: list[torch.Tensor] = []
        self._versions[version] = copies  # registered first: a consumer may stop at the last tensor
        while len(self._versions) > keep:
            self._versions.popitem(last=False)
        for tensor in tensors:
            copies.append(tensor.detach().to("cpu", copy=True))
            yield tensor

    def tensors(self, version: int) -> list[torch.Tensor]:
        if version not in self._versions:
            raise KeyError(f"weights version {version} is not kept (kept: {list(self._versions)})")
        return self._versions[version]

    @property
    def versions(self) -> list[int]:
        return list(self._versions)
