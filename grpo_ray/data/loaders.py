"""Read prompt/answer rows from local files or hub ids through `datasets`.

Recognised shapes, detected per file:
- generic rows: prompt from prompt/question/problem/input/instruction, answer from
  answer/solution/output/ground_truth (or the fields named in the config);
- verl-style parquet: `prompt` is a chat list (the last user message is the prompt) and the answer
  is `reward_model.ground_truth`;
- "tiny:train" / "tiny:heldout": the project's offline arithmetic task.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROMPT_FIELDS = ("prompt", "question", "problem", "input", "instruction")
ANSWER_FIELDS = ("answer", "solution", "output", "ground_truth")
_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}


class DataError(ValueError):
    """A dataset that cannot be used; one-line message naming the file and what to do."""


@dataclass(frozen=True)
class Row:
    prompt: str
    answer: str
    fields: dict[str, Any]


def resolve_data_path(spec: str) -> str:
    if spec.startswith("tiny:"):
        from grpo_ray.models.tiny import ensure_tiny_artifacts

        split = spec.removeprefix("tiny:")
        artifacts = ensure_tiny_artifacts()
        files = {"train": artifacts.train_file, "heldout": artifacts.heldout_file}
        if split not in files:
            raise DataError(f"{spec}: unknown tiny split; use tiny:train or tiny:heldout")
        return str(files[split])
    return spec


def check_data_path(spec: str, field: str) -> None:
    """Fail fast, in the driver, on a local file that does not exist."""
    if spec.startswith("tiny:"):
        return
    path = Path(spec).expanduser()
    if Path(spec).suffix in _FORMATS and not path.exists():
        raise DataError(f"{field}: {spec} does not exist; give an existing jsonl/json/parquet/arrow file or a hub id")


def load_rows(spec: str, prompt_field: str | None = None, answer_field: str | None = None) -> tuple[list[Row], int]:
    """All usable rows of one file or hub dataset, and how many rows were skipped as unusable."""
    records = _load_records(resolve_data_path(spec), spec)
    rows: list[Row] = []
    skipped = 0
    for record in records:
        row = _to_row(record, prompt_field, answer_field)
        if row is None:
            skipped += 1
        else:
            rows.append(row)
    if not rows:
        hint = f"prompt field {prompt_field or ' / '.join(PROMPT_FIELDS)}, answer field {answer_field or ' / '.join(ANSWER_FIELDS)}"
        raise DataError(f"{spec}: no usable rows ({skipped} skipped); rows need a non-empty {hint}")
    return rows, skipped


def _load_records(path: str, spec: str) -> list[dict[str, Any]]:
    import datasets

    datasets.disable_progress_bars()
    local = Path(path).expanduser()
    try:
        if local.is_file():
            builder = _FORMATS.get(local.suffix)
            if builder is None:
                raise DataError(f"{spec}: unsupported file type {local.suffix}; use jsonl, json, parquet or arrow")
            dataset = datasets.load_dataset(builder, data_files=str(local), split="train")
        elif local.is_dir():
            dataset = datasets.load_dataset(str(local), split="train")
        else:
            dataset = datasets.load_dataset(path, split="train")
    except DataError:
        raise
    except Exception as err:  # datasets raises many types; all mean "cannot read this"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"{spec}: cannot read ({first}); check the path or hub id") from None
    return list(dataset)


def _to_row(record: dict[str, Any], prompt_field: str | None, answer_field: str | None) -> Row | None:
    prompt = _prompt_text(record.get(prompt_field) if prompt_field else _first(record, PROMPT_FIELDS))
    if answer_field:
        answer = record.get(answer_field)
    else:
        answer = _first(record, ANSWER_FIELDS)
        if answer is None and isinstance(record.get("reward_model"), dict):
            answer = record["reward_model"].get("ground_truth")
    if not isinstance(prompt, str) or not prompt.strip():
        return None
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        return None
    used = {prompt_field, answer_field, *PROMPT_FIELDS, *ANSWER_FIELDS}
    fields = {k: v for k, v in record.items() if k not in used}
    return Row(prompt=prompt, answer=answer.strip(), fields=fields)


def _first(record: dict[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        if record.get(name) is not None:
            return record[name]
    return None


def _prompt_text(value: Any) -> str | None:
    """A prompt is a string, or a chat list whose last user message is the prompt."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    return None
