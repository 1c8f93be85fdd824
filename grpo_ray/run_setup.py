"""Everything a run needs before the first actor starts: paths checked, prompts tokenised.

Doing this in the driver first means a wrong path is a one-line error in a second, not an
actor crash after the cluster spun up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_ray.config import Config
from grpo_ray.data.loaders import DataError, check_data_path, load_rows
from grpo_ray.data.prompts import tokenize_prompts
from grpo_ray.models.loading import check_model_path, load_tokenizer
from grpo_ray.types import Probe, Prompt


@dataclass(frozen=True)
class RunInputs:
    train_prompts: list[Prompt]
    eval_prompts: list[Prompt]
    probe: Probe
    skipped_rows: int
    dropped_too_long: int


def prepare_inputs(cfg: Config) -> RunInputs:
    check_model_path(cfg.model.path, "model.path")
    if cfg.model.tokenizer:
        check_model_path(cfg.model.tokenizer, "model.tokenizer")
    for spec in cfg.data.train_files:
        check_data_path(spec, "data.train_files")
    for spec in cfg.data.eval_files:
        check_data_path(spec, "data.eval_files")
    tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.path)

    def prompts_of(files: tuple[str, ...], limit: int | None) -> tuple[list[Prompt], int, int]:
        rows, skipped = [], 0
        for spec in files:
            file_rows, file_skipped = load_rows(spec, cfg.data.prompt_field, cfg.data.answer_field)
            rows.extend(file_rows)
            skipped += file_skipped
        if limit is not None:
            rows = rows[:limit]
        prompt_set = tokenize_prompts(rows, tokenizer, cfg.data.max_prompt_tokens, cfg.data.apply_chat_template)
        return prompt_set.prompts, skipped, prompt_set.dropped_too_long

    train, skipped, dropped = prompts_of(cfg.data.train_files, None)
    if not train:
        raise DataError(
            f"data.train_files: every prompt is longer than data.max_prompt_tokens={cfg.data.max_prompt_tokens}; raise it"
        )
    evaluation, eval_skipped, eval_dropped = prompts_of(cfg.data.eval_files, cfg.data.eval_limit) if cfg.data.eval_files else ([], 0, 0)
    return RunInputs(
        train_prompts=train,
        eval_prompts=evaluation,
        probe=make_probe(train[0], tokenizer),
        skipped_rows=skipped + eval_skipped,
        dropped_too_long=dropped + eval_dropped,
    )


def make_probe(prompt: Prompt, tokenizer) -> Probe:
    """A fixed sequence: a training prompt followed by its reference answer and the end-of-turn token."""
    completion = tokenizer(prompt.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = list(prompt.token_ids) + completion
    mask = np.zeros((1, len(ids)), dtype=np.float32)
    mask[0, len(prompt.token_ids) :] = 1.0
    return Probe(
        input_ids=np.array([ids], dtype=np.int64),
        attention_mask=np.ones((1, len(ids)), dtype=np.int64),
        completion_mask=mask,
    )
