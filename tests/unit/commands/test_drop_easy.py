"""`grpo-ray polaris drop-easy`: which records survive a ledger, with uids running on across two
files and counting an unusable record, and the one-line errors for ledgers that do not fit."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from grpo_ray.algo.polaris import PromptLedger
from grpo_ray.cli import main

FIRST_FILE = [
    {"prompt": "What is 1 + 1?", "answer": "2"},  # uid 0
    {"prompt": "A prompt without an answer", "answer": ""},  # uid 1: unusable, but still counted
    {"prompt": "Combien font 2 × 3 ?", "answer": "6"},  # uid 2
    {"prompt": "What is 9 - 4?", "answer": "5"},  # uid 3
]
SECOND_FILE = [
    {"prompt": "What is 3 + 3?", "answer": "6"},  # uid 4
    {"prompt": "What is 7 * 7?", "answer": "49"},  # uid 5
    {"prompt": "What is 8 / 2?", "answer": "4"},  # uid 6
]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return str(path)


@pytest.fixture
def data_files(tmp_path):
    return write_jsonl(tmp_path / "first.jsonl", FIRST_FILE), write_jsonl(tmp_path / "second.jsonl", SECOND_FILE)


@pytest.fixture
def ledger_file(tmp_path):
    ledger = PromptLedger()
    # Step 1, per-uid means: uid 0 -> 1.0, uid 2 -> 0.9, uid 3 -> 0.5, uid 5 -> 1.0.
    ledger.record(np.array([0, 0, 2, 2, 3, 3, 5, 5]), np.array([1.0, 1.0, 0.9, 0.9, 1.0, 0.0, 1.0, 1.0]))
    # Step 2: uid 5 -> 0.9, so its average is (1.0 + 0.9) / 2 = 0.95.
    ledger.record(np.array([5, 5]), np.array([1.0, 0.8]))
    path = tmp_path / "ledger.jsonl"
    ledger.save(path)
    return str(path)


def drop_easy(*args):
    return CliRunner().invoke(main, ["polaris", "drop-easy", *args])


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_drops_the_easy_records_of_both_files_in_order(tmp_path, data_files, ledger_file):
    out = tmp_path / "stage2" / "train.jsonl"
    result = drop_easy("--ledger", ledger_file, "--data", data_files[0], "--data", data_files[1], "--output", str(out))
    assert result.exit_code == 0, result.output
    # Averages: uid 0 is 1.0 and uid 5 is 0.95, both above 0.9: dropped. uid 2 is exactly 0.9, not
    # above: kept. uid 5 is the SECOND record of the second file, since uids run on after file 1's four.
    everything = FIRST_FILE + SECOND_FILE
    assert read_jsonl(out) == [everything[uid] for uid in (1, 2, 3, 4, 6)]
    assert "Combien font 2 × 3 ?" in out.read_text(encoding="utf-8")  # written as is, not \u-escaped
    assert result.output.strip().splitlines() == [f"read 7 records, dropped 2 (average reward > 0.9), wrote 5 to {out}"]


def test_threshold_option(tmp_path, data_files, ledger_file):
    out = tmp_path / "kept.jsonl"
    result = drop_easy(
        "--ledger",
        ledger_file,
        "--data",
        data_files[0],
        "--data",
        data_files[1],
        "--output",
        str(out),
        "--threshold",
        "0.4",
    )
    assert result.exit_code == 0, result.output
    # Above 0.4: uids 0 (1.0), 2 (0.9), 3 (0.5), 5 (0.95).
    assert read_jsonl(out) == [FIRST_FILE[1], SECOND_FILE[0], SECOND_FILE[2]]
    assert "dropped 4 (average reward > 0.4), wrote 3" in result.output


def one_line_error(result):
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    return line


def test_missing_ledger(tmp_path, data_files):
    missing = tmp_path / "nope.jsonl"
    result = drop_easy("--ledger", str(missing), "--data", data_files[0], "--output", str(tmp_path / "out.jsonl"))
    assert (
        one_line_error(result)
        == f"error: --ledger: {missing} does not exist; give the prompt ledger the training run saved"
    )
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(
    "bad_line",
    [
        "not json",
        '{"uid": 1, "sum": 1.0}',  # no count
        '{"uid": 1, "sum": 1.0, "count": 0}',  # an average over nothing
        '{"uid": "1", "sum": 1.0, "count": 1}',
        '{"uid": 1.5, "sum": 1.0, "count": 1}',
        '{"uid": -1, "sum": 1.0, "count": 1}',
        '{"uid": 1, "sum": NaN, "count": 1}',
        "[1, 1.0, 1]",
    ],
)
def test_unreadable_ledger_line(tmp_path, data_files, bad_line):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text('{"uid": 0, "sum": 1.0, "count": 1}\n\n' + bad_line + "\n")
    result = drop_easy("--ledger", str(ledger), "--data", data_files[0], "--output", str(tmp_path / "out.jsonl"))
    # Line 3: the blank line 2 is skipped, but counted.
    assert one_line_error(result).startswith(f"error: --ledger: {ledger} line 3 is unreadable; expected JSON lines")
    assert not (tmp_path / "out.jsonl").exists()


def test_ledger_uid_beyond_the_data(tmp_path, data_files, ledger_file):
    # The ledger knows uid 5; the first file alone has records 0..3.
    result = drop_easy("--ledger", ledger_file, "--data", data_files[0], "--output", str(tmp_path / "out.jsonl"))
    assert one_line_error(result) == (
        "error: --ledger: uid 5 but --data has 4 records; "
        "pass the same files, in the same order, as the run's data.train_files"
    )
    assert not (tmp_path / "out.jsonl").exists()


def test_missing_data_file_and_bad_threshold(tmp_path, ledger_file, data_files):
    missing = tmp_path / "missing.jsonl"
    result = drop_easy("--ledger", ledger_file, "--data", str(missing), "--output", str(tmp_path / "out.jsonl"))
    assert one_line_error(result).startswith(f"error: --data: {missing} does not exist")
    result = drop_easy(
        "--ledger", ledger_file, "--data", data_files[0], "--output", str(tmp_path / "out.jsonl"), "--threshold", "1.5"
    )
    assert one_line_error(result).startswith("error: --threshold 1.5: must be in [0, 1]")
