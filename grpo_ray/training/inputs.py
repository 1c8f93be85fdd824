"""Everything a run needs before the first actor starts: paths checked, prompts tokenised.

Doing this in the driver first means a wrong path is a one-line error in a second, not an
actor crash after the cluster spun up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_ray.config import Config
from grpo_ray.data.loaders import DataError, Row, check_data_path, load_rows
from grpo_ray.data.selection import in_difficulty_band, split_validation, with_instruction
from grpo_ray.data.prompts import tokenize_prompts
from grpo_ray.models.loading import load_tokenizer
from grpo_ray.models.reference_vocab import check_reference_tokenizer, check_teacher_tokenizer
from grpo_ray.types import Probe, Prompt

# The weight-sync probe: the first training prompts with their answers (make_probe).
PROBE_ROWS = 8


@dataclass(frozen=True)
class RunInputs:
    train_prompts: list[Prompt]
    eval_prompts: list[Prompt]
    probe: Probe | None  # None under model.quantization (see prepare_inputs)
    pad_id: int  # the tokenizer's padding id (assembled slices are padded with it)
    skipped_rows: int  # rows without a usable prompt or answer
    dropped_too_long: int  # prompts over data.max_prompt_tokens
    dropped_by_difficulty: int  # training rows outside data.difficulty_band
    # The first training prompt's tokens decoded with their special tokens (a BOS, the template's
    # markers) shown: what `validate` prints, so a missing BOS or a wrong template is seen before a run.
    first_prompt_shown: str = ""


def read_data_files(cfg: Config) -> None:
    """The rows of data files known to exist (check_data_paths) map to prompts and answers, without a
    tokenizer (the check that is left when the model does not resolve: both problems are then named
    at once)."""
    _read(cfg, cfg.data.train_files)
    if cfg.data.eval_files:
        _read(cfg, cfg.data.eval_files)


def check_data_paths(cfg: Config) -> None:
    """Every data file exists (a hub dataset answers), without reading it."""
    for spec in cfg.data.train_files:
        check_data_path(spec, "data.train_files")
    for spec in cfg.data.eval_files:
        check_data_path(spec, "data.eval_files")


def _read(cfg: Config, files: tuple[str, ...]) -> tuple[list[Row], int]:
    rows, skipped = [], 0
    for spec in files:
        # Indices run on across files: a uid names one record of the whole list.
        first_index = len(rows) + skipped
        file_rows, file_skipped = load_rows(spec, cfg.data.prompt_field, cfg.data.answer_field, first_index)
        rows.extend(file_rows)
        skipped += file_skipped
    return with_instruction(rows, cfg.data.instruction), skipped


def prepare_inputs(cfg: Config) -> RunInputs:
    """The run's prompts, tokenised, and its probe; a missing data file named first."""
    check_data_paths(cfg)
    return tokenized_inputs(cfg)


def tokenized_inputs(cfg: Config) -> RunInputs:
    """prepare_inputs for data files known to exist (check_data_paths)."""
    tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.path)
    # Before any actor starts: a reference or teacher with other token ids would make the KL noise.
    check_reference_tokenizer(tokenizer, cfg.reference.model_path, cfg.reference.tokenizer)
    student = cfg.model.tokenizer or cfg.model.path
    for i, t in enumerate(cfg.distillation.teachers):
        check_teacher_tokenizer(tokenizer, student, f"distillation.teachers.{i}", t.name, t.model_path, t.tokenizer)

    def tokenized(rows: list[Row], field: str) -> tuple[list[Prompt], int]:
        prompt_set = tokenize_prompts(rows, tokenizer, cfg.data.max_prompt_tokens, cfg.data.apply_chat_template)
        if rows and not prompt_set.prompts:
            raise DataError(
                f"{field}: every prompt is longer than data.max_prompt_tokens={cfg.data.max_prompt_tokens}; raise it"
            )
        return prompt_set.prompts, prompt_set.dropped_too_long

    train_rows, skipped = _read(cfg, cfg.data.train_files)
    train_rows, out_of_band = in_difficulty_band(train_rows, cfg.data.difficulty_band)
    eval_rows, eval_skipped = _read(cfg, cfg.data.eval_files) if cfg.data.eval_files else ([], 0)
    if not cfg.data.eval_files:
        train_rows, eval_rows = split_validation(train_rows, cfg.data.val_fraction, cfg.seed)
    if cfg.data.eval_limit is not None:
        eval_rows = eval_rows[: cfg.data.eval_limit]
    train, dropped = tokenized(train_rows, "data.train_files")
    evaluation, eval_dropped = tokenized(eval_rows, "data.eval_files")
    return RunInputs(
        train_prompts=train,
        eval_prompts=evaluation,
        # model.quantization: the learner's base is quantised and the engine's is not, so their
        # log-probs differ by the quantisation error and the probe would stop the run; off.
        probe=None if cfg.model.quantization else make_probe(train[:PROBE_ROWS], tokenizer),
        pad_id=int(tokenizer.pad_token_id),  # load_tokenizer sets one when the model has none
        skipped_rows=skipped + eval_skipped,
        dropped_too_long=dropped + eval_dropped,
        dropped_by_difficulty=out_of_band,
        first_prompt_shown=tokenizer.decode(list(train[0].token_ids), skip_special_tokens=False) if train else "",
    )


def make_probe(prompts: list[Prompt], tokenizer) -> Probe:
    """A fixed batch: each prompt followed by its reference answer and the end-of-turn token, right-padded.
    Several rows, so that the probe's mean gaps (transport/probe.py) average over more than the few
    tokens of one short answer."""
    rows = [
        (list(p.token_ids), tokenizer(p.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        for p in prompts
    ]
    width = max(len(prompt) + len(completion) for prompt, completion in rows)
    input_ids = np.full((len(rows), width), tokenizer.pad_token_id, dtype=np.int64)
    attention = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.float32)
    for i, (prompt, completion) in enumerate(rows):
        input_ids[i, : len(prompt) + len(completion)] = prompt + completion
        attention[i, : len(prompt) + len(completion)] = 1
        mask[i, len(prompt) : len(prompt) + len(completion)] = 1.0
    return Probe(input_ids=input_ids, attention_mask=attention, completion_mask=mask)
