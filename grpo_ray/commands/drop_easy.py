"""POLARIS drop-easy between training stages: `grpo-ray polaris drop-easy`.

    grpo-ray polaris drop-easy --ledger runs/stage1/ledger.jsonl \\
        --data polaris-train.parquet --output stage2-train.jsonl --threshold 0.9

POLARIS removes, before the next stage, the prompts the model already solves: those whose average
reward over the steps they appeared in is above 0.9. The training run keeps that average per
prompt uid in a `PromptLedger` and saves it as JSON lines `{"uid": .., "sum": .., "count": ..}`.
A uid is the index of a record in the run's data.train_files, counting every raw record (unusable
ones too) and running on across files (`Row.index`), so the same files in the same order map each
uid back to its record. Every record that is not easy (ledger average strictly above the
threshold) is written to the output, in order, unchanged, ready to be the next stage's
data.train_files; prompts the ledger never saw are kept.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_ray.algo.polaris import PromptLedger
from grpo_ray.data.loaders import DataError, check_data_path, load_records

LEDGER_FORMAT = 'JSON lines {"uid": int, "sum": float, "count": int} as PromptLedger.save writes'


@dataclass(frozen=True)
class DropEasyReport:
    read: int  # raw records in the data files
    dropped: int  # easy records left out
    written: int  # records written to the output
    output: Path

    def summary_line(self, threshold: float) -> str:
        return (
            f"read {self.read} records, dropped {self.dropped} (average reward > {threshold:g}), "
            f"wrote {self.written} to {self.output}"
        )


def drop_easy_records(ledger_path: str, data: tuple[str, ...], output: str, threshold: float = 0.9) -> DropEasyReport:
    """Write the records of `data` whose uid is not easy in the ledger to `output` (JSON lines)."""
    if not (math.isfinite(threshold) and 0 <= threshold <= 1):
        raise DataError(f"--threshold {threshold}: must be in [0, 1], like polaris.drop_easy_threshold")
    if not data:
        raise DataError("--data: give the run's data.train_files, in the same order")
    ledger = read_ledger(ledger_path)
    for spec in data:
        check_data_path(spec, "--data")
    records = read_all_records(data)
    if len(ledger):
        highest = max(uid for uid, _, _ in ledger.state_dict()["prompts"])
        if highest >= len(records):
            raise DataError(
                f"--ledger: uid {highest} but --data has {len(records)} records; "
                "pass the same files, in the same order, as the run's data.train_files"
            )
    easy = ledger.easy_prompts(threshold)
    kept = [record for uid, record in enumerate(records) if uid not in easy]
    destination = Path(output)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with destination.open("w", encoding="utf-8") as out:
        for record in kept:
            out.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
    return DropEasyReport(read=len(records), dropped=len(records) - len(kept), written=len(kept), output=destination)


def read_ledger(path: str) -> PromptLedger:
    """PromptLedger.load, after checking each line, so a bad file is one line naming where it broke.

    Checked beyond what load needs: count >= 1 (the average divides by it) and integral uids
    (load would silently turn 3.7 into 3, and "3" would pass as a string).
    """
    ledger_file = Path(path)
    if not ledger_file.is_file():
        raise DataError(f"--ledger: {path} does not exist; give the prompt ledger the training run saved")
    with ledger_file.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip() and not _is_ledger_entry(line):
                raise DataError(f"--ledger: {path} line {number} is unreadable; expected {LEDGER_FORMAT}")
    return PromptLedger.load(ledger_file)


def _is_ledger_entry(line: str) -> bool:
    try:
        entry = json.loads(line)
    except ValueError:
        return False
    if not isinstance(entry, dict):
        return False
    uid, total, count = (entry.get(key) for key in ("uid", "sum", "count"))
    return _is_whole(uid) and uid >= 0 and _is_whole(count) and count >= 1 and _is_finite_number(total)


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not a uid


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_all_records(data: tuple[str, ...]) -> list[dict[str, Any]]:
    """The raw records of every file, in order: position in this list = the uid the run gave it."""
    records: list[dict[str, Any]] = []
    for spec in data:
        try:
            records += load_records(spec)
        except DataError as err:
            raise DataError(f"--data: {err}") from None
    return records
