"""TeacherWorker: a teacher model's log-prob of every token the student sampled (distillation).

Started once per `distillation.teachers` entry. It reads the slices the learners train on, as the
reference does, and gives the teacher's log-probs of the sampled tokens, NaN on the rows it does
not teach (another data source's, algo/distill.py). How it scores is chosen once, at start:

    Forward  a model_path teacher (backend hf): the reference's forward (micro-batches, packing,
             chunked LM head), at the stage's temperature
    Engine   a model_path teacher with backend vllm: a vLLM engine of its own (actors/engines.py,
             imported only then), its prompt log-probs
    Server   a url teacher: a vLLM server's prompt log-probs over HTTP (actors/http_teacher.py),
             where a row may fail: it stays NaN (untaught) and is counted in its TeacherSums

vLLM's prompt log-probs are the model's at temperature 1 (it applies no temperature to them), so
the last two refuse another (validate refuses such a recipe first). The array stays in the object
store for the learners; the driver pulls only the sums its metrics are made of.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import numpy as np

from grpo_ray.actors.engines import EngineSpec, build_engine
from grpo_ray.actors.http_teacher import RowScores, ServerSettings, ServerTeacher
from grpo_ray.actors.reference import ReferenceWorker
from grpo_ray.algo.distill import TeacherSums, taught_rows, teacher_sums
from grpo_ray.models.loading import resolve_model_path
from grpo_ray.types import RolloutSlice


@dataclass(frozen=True)
class TeacherSettings:
    name: str  # distill/<name>/... metrics
    model_path: str | None  # None: a url teacher's (`server`)
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
    engine: EngineSpec | None = None  # backend vllm: its engine (model_path resolved where the actor runs)
    server: ServerSettings | None = None  # a url teacher: its server


class Forward:
    """A model_path teacher's transformers forward, the reference's."""

    at_any_temperature = True

    def __init__(self, s: TeacherSettings):
        self.model = ReferenceWorker(
            s.model_path,
            s.dtype,
            s.micro_batch_size,
            s.torch_threads,
            s.chunk_tokens,
            s.packing,
            s.max_tokens_per_micro_batch,
            s.logprob_kernel,
        )

    def score(self, batch: RolloutSlice, temperature: float) -> RowScores:
        return RowScores.complete(self.model.logprobs(batch, temperature))

    def close(self) -> None:
        """Nothing to stop: the model runs in this process."""


class Engine:
    """A model_path teacher's own vLLM engine (backend vllm): its prompt log-probs."""

    at_any_temperature = False

    def __init__(self, spec: EngineSpec):
        # It only scores token ids: no text is decoded, so no tokenizer.
        self.engine = build_engine(dataclasses.replace(spec, model_path=resolve_model_path(spec.model_path)), None)

    def score(self, batch: RolloutSlice, temperature: float) -> RowScores:
        return RowScores.complete(self.engine.score(batch.input_ids, batch.attention_mask, 1.0))

    def close(self) -> None:
        self.engine.shutdown()


class Server:
    """A url teacher: its server's prompt log-probs over HTTP (rows may fail)."""

    at_any_temperature = False

    def __init__(self, settings: ServerSettings):
        self.server = ServerTeacher(settings)

    def score(self, batch: RolloutSlice, temperature: float) -> RowScores:
        return self.server.score(batch.input_ids, batch.attention_mask)

    def close(self) -> None:
        self.server.close()


class TeacherWorker:
    def __init__(self, settings: TeacherSettings):
        self.settings = settings
        if settings.server is not None:
            self.scorer: Forward | Engine | Server = Server(settings.server)
        elif settings.engine is not None:
            self.scorer = Engine(settings.engine)
        else:
            self.scorer = Forward(settings)
        self._told_failure = False  # a failed row's error is printed once, then only counted

    def ready(self) -> str:
        return f"teacher {self.settings.name}"

    def logprobs(self, batch: RolloutSlice, temperature: float) -> tuple[np.ndarray, TeacherSums]:
        """([N, T] float32 the teacher's log-prob of each sampled token, 0 outside the model's
        tokens and NaN on rows it does not teach or failed to score; the sums of its metrics over
        this slice, failed rows counted)."""
        if temperature != 1 and not self.scorer.at_any_temperature:
            raise ValueError(
                f"teacher {self.settings.name}: vLLM's prompt log-probs are the model's at temperature 1, and this "
                f"stage samples at {temperature:g}; sample at temperature 1 or use backend: hf"
            )
        values = batch.row_fields.get(self.settings.source_field)
        rows = np.flatnonzero(taught_rows(values, batch.num_rows, self.settings.sources, self.settings.others))
        out = np.full(batch.input_ids.shape, np.nan, dtype=np.float32)
        scores = None
        if len(rows):
            part = batch.select(rows)
            scores = self.scorer.score(part, temperature)
            out[rows] = scores.logprobs * part.completion_mask  # a failed row's NaN stays: untaught
        sums = teacher_sums(out, batch.completion_mask)
        if scores is None or not scores.failed.any():
            return out, sums
        self._tell_failure(int(scores.failed.sum()), len(rows), scores.first_error)
        return out, dataclasses.replace(sums, failed_rows=int(scores.failed.sum()), first_error=scores.first_error)

    def close(self) -> None:
        """End a vLLM engine's processes or the HTTP pool's threads now, not at exit."""
        self.scorer.close()

    def _tell_failure(self, failed: int, asked: int, error: str) -> None:
        """The first failed row's error on the actor's console (the driver's, through Ray), once."""
        if self._told_failure:
            return
        self._told_failure = True
        server = self.settings.server
        print(
            f"teacher {self.settings.name} ({server.url if server else self.settings.model_path}): {failed} of "
            f"{asked} rows failed, the first with: {error}; such rows keep their GRPO advantage and count in "
            f"distill/{self.settings.name}/failed_rows (said once)",
            file=sys.stderr,
            flush=True,
        )
