"""Read prompt/answer rows from local files or hub ids (JSON lines read as written; parquet, arrow and hub
ids through `datasets`).

Row shapes (POLARIS, GSM8K, verl-style parquet, generic fields) are detected per row by
`grpo_ray.data.formats`; "tiny:train" / "tiny:heldout" (and "tiny-tools:", "smollm2-135m:", "gemma3-270m:") name the
built-in models' offline tasks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_ray.builtin_names import BUILT_IN_DATA_PREFIXES, GEMMA3, SMOLLM2, TINY
from grpo_ray.errors import first_line, missing_path_hint
from grpo_ray.data.formats import GENERIC_ANSWER_FIELDS, GENERIC_PROMPT_FIELDS, PromptShapeError, parse_row

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}


class DataError(ValueError):
    """A dataset that cannot be used; one-line message naming the file and what to do."""


@dataclass(frozen=True)
class Row:
    prompt: str  # the user's message the model answers (the last of a chat-list prompt)
    answer: str
    fields: dict[str, Any]
    # Position of the record in its data files, counting unusable records too: the prompt uid that
    # ledgers and checkpoints name, stable under filtering, so `grpo-ray polaris drop-easy` can
    # map it back to the file.
    index: int = 0
    # The chat messages before the prompt (a system message, earlier turns) of a chat-list prompt,
    # rendered before it by the chat template; () for a prompt given as text.
    context: tuple[dict[str, Any], ...] = ()


def resolve_data_path(spec: str) -> str:
    """A built-in task's split ("tiny:train", "smollm2-135m:heldout") -> its cached file (written on
    first use); anything else unchanged."""
    if not spec.startswith(BUILT_IN_DATA_PREFIXES):
        return spec
    name, _, split = spec.partition(":")
    if split not in ("train", "heldout"):
        raise DataError(f"{spec}: unknown split; use {name}:train or {name}:heldout")
    if name == SMOLLM2:
        from grpo_ray.models.smollm2 import ensure_smollm2_data

        files = dict(zip(("train", "heldout"), ensure_smollm2_data()))
    elif name == GEMMA3:
        from grpo_ray.models.gemma3 import ensure_gemma3_data

        files = dict(zip(("train", "heldout"), ensure_gemma3_data()))
    else:
        from grpo_ray.models.tiny import ensure_tiny_artifacts
        from grpo_ray.models.tiny_tools import ensure_tiny_tools_artifacts

        artifacts = ensure_tiny_artifacts() if name == TINY else ensure_tiny_tools_artifacts()
        files = {"train": artifacts.train_file, "heldout": artifacts.heldout_file}
    return str(files[split])


def check_data_path(spec: str, field: str) -> None:
    """Fail fast, in the driver, on a local file that does not exist or a hub id that is neither
    cached here nor answers on the hub."""
    from grpo_ray.models.hub import looks_like_hub_id

    if spec.startswith(BUILT_IN_DATA_PREFIXES):
        return
    path = Path(spec).expanduser()
    if Path(spec).suffix in _FORMATS and not path.exists():
        raise DataError(
            f"{field}: {spec} does not exist {missing_path_hint(field)}; "
            "give a jsonl/json/parquet/arrow file or a hub id"
        )
    if not path.exists() and looks_like_hub_id(spec):
        check_hub_dataset(spec, field)


def check_hub_dataset(repo_id: str, field: str) -> None:
    """DataError (one line naming `field`) unless the hub dataset is in this machine's cache or
    answers on the hub in one short request: `datasets` itself retries an unreachable hub for about
    a minute, printing each retry, and its final error names no field."""
    from huggingface_hub import constants

    from grpo_ray.models.hub import check_hub_answers

    if not (Path(constants.HF_HUB_CACHE) / f"datasets--{repo_id.replace('/', '--')}").is_dir():
        check_hub_answers(repo_id, field, "dataset", DataError, "give a local jsonl/json/parquet/arrow file")


def load_rows(
    spec: str, prompt_field: str | None = None, answer_field: str | None = None, first_index: int = 0
) -> tuple[list[Row], int]:
    """All usable rows of one file or hub dataset, and how many rows were skipped as unusable.

    Row.index is `first_index` + the record's position in the file (pass the record count of the
    files before it to number several files as one).
    """
    records = _load_records(resolve_data_path(spec), spec)
    rows: list[Row] = []
    skipped = 0
    for position, record in enumerate(records):
        try:
            row = _to_row(record, prompt_field, answer_field, first_index + position)
        except PromptShapeError as err:
            # Refused, not skipped: reading part of a conversation would train on another prompt.
            raise DataError(f"{spec}: record {position} (counting from 0): {err}") from None
        if row is None:
            skipped += 1
        else:
            rows.append(row)
    if not rows:
        hint = (
            f"prompt field {prompt_field or ' / '.join(GENERIC_PROMPT_FIELDS)}, "
            f"answer field {answer_field or ' / '.join(GENERIC_ANSWER_FIELDS)}"
        )
        raise DataError(f"{spec}: no usable rows ({skipped} skipped); rows need a non-empty {hint}")
    return rows, skipped


def load_records(spec: str) -> list[dict[str, Any]]:
    """The raw records of one file or hub dataset, in file order (what Row.index counts)."""
    return _load_records(resolve_data_path(spec), spec)


def _load_records(path: str, spec: str) -> list[dict[str, Any]]:
    import datasets

    datasets.disable_progress_bars()
    local = Path(path).expanduser()
    try:
        if local.is_file():
            builder = _FORMATS.get(local.suffix)
            if builder is None:
                raise DataError(f"{spec}: unsupported file type {local.suffix}; use jsonl, json, parquet or arrow")
            if builder == "json":
                return _json_records(local, spec)
            dataset = datasets.load_dataset(builder, data_files=str(local), split="train")
        elif local.is_dir():
            dataset = datasets.load_dataset(str(local), split="train")
        else:
            dataset = datasets.load_dataset(path, split="train")
    except DataError:
        raise
    except Exception as err:  # datasets raises many types; all mean "cannot read this"
        raise DataError(f"{spec}: cannot read ({first_line(err)}); check the path or hub id") from None
    return list(dataset)


def _json_records(local: Path, spec: str) -> list[Any]:
    """The records of a JSON-lines file (or of a .json file holding one array), as written.

    Not through `datasets`: it casts each column to one type, which changes values (an int answer
    in a column of strings) or refuses the whole file (mixed shapes, a field with an empty name),
    where one odd record should only be skipped and counted.
    """
    try:
        text = local.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{spec}: cannot read ({err}); give a UTF-8 JSON-lines file") from None
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, list):
        return whole
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise DataError(f"{spec}: line {number} is not JSON ({err.msg}); fix or remove that line") from None
    return records


def _to_row(record: Any, prompt_field: str | None, answer_field: str | None, index: int) -> Row | None:
    if not isinstance(record, Mapping):
        return None  # a JSON line holding a number, string or list is no row
    parsed = parse_row(record, prompt_field, answer_field)
    if parsed is None:
        return None
    # `datasets` gives every row every column of the file, None where the row has none.
    fields = {name: value for name, value in parsed.fields.items() if value is not None}
    return Row(prompt=parsed.prompt, answer=parsed.answer, fields=fields, index=index, context=parsed.context)
