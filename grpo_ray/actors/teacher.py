"""TeacherWorker: a teacher model's log-prob of every token the student sampled (distillation).

Started once per `distillation.teachers` entry with a model (a folder, hub id or built-in). It
reads the slices the learners train on, as the reference does, with the reference's forward
(micro-batches, packing, chunked LM head): the teacher's log-probs of the sampled tokens at the
stage's temperature, NaN on the rows it does not teach (another data source's, algo/distill.py).
The array stays in the object store for the learners; the driver pulls only the sums its metrics
are made of.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_ray.actors.reference import ReferenceWorker
from grpo_ray.algo.distill import TeacherSums, taught_rows, teacher_sums
from grpo_ray.types import RolloutSlice


@dataclass(frozen=True)
class TeacherSettings:
    name: str  # distill/<name>/... metrics
    model_path: str
    dtype: str
    micro_batch_size: int
    source_field: str  # the row field that names a row's data source
    sources: tuple[str, ...] = ()  # the sources it teaches; (): every row but `others`'
    others: tuple[str, ...] = ()  # the sources the recipe's other teachers take
    torch_threads: int = 1
    chunk_tokens: int = 0
    packing: bool = False
    max_tokens_per_micro_batch: int = 0
    logprob_kernel: str = "torch"


class TeacherWorker:
    def __init__(self, settings: TeacherSettings):
        self.settings = settings
        self.forward = ReferenceWorker(
            settings.model_path,
            settings.dtype,
            settings.micro_batch_size,
            settings.torch_threads,
            settings.chunk_tokens,
            settings.packing,
            settings.max_tokens_per_micro_batch,
            settings.logprob_kernel,
        )

    def ready(self) -> str:
        return f"teacher {self.settings.name}"

    def logprobs(self, batch: RolloutSlice, temperature: float) -> tuple[np.ndarray, TeacherSums]:
        """([N, T] float32 the teacher's log-prob of each sampled token, 0 outside the model's
        tokens and NaN on rows it does not teach; the sums of its metrics over this slice)."""
        values = batch.row_fields.get(self.settings.source_field)
        rows = taught_rows(values, batch.num_rows, self.settings.sources, self.settings.others)
        out = np.full(batch.input_ids.shape, np.nan, dtype=np.float32)
        if rows.any():
            out[rows] = self.forward.logprobs(batch.select(np.flatnonzero(rows)), temperature)
        return out, teacher_sums(batch.rollout_logprobs, out, batch.completion_mask)
