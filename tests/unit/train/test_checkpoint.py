"""Checkpoint folders on a real filesystem: atomic rename, the last K, a full disk, safe loading."""

import json
import os
import pickle
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from grpo_ray.models.tensor_files import load_tensors, save_tensors
from grpo_ray.train.checkpoint import (
    HASH_VERSION,
    RecipeHashes,
    recipe_hashes,
    CheckpointError,
    TrainerState,
    complete_checkpoints,
    latest_checkpoint,
    read_state,
    recipe_hash,
    resume_point,
    set_aside,
    write_checkpoint,
)


def state(step: int, recipe: str = "abc", hash_version: int = HASH_VERSION) -> TrainerState:
    return TrainerState(step=step, stage_index=0, run_id="run", stage_run_id=None, recipe_hash=recipe,
                        builder={"batches_drawn": step}, accuracy={"0": 0.25}, hash_version=hash_version)


ABC = RecipeHashes(current="abc", legacy="old")


def write_tensor(folder: Path) -> None:
    (folder / "learner").mkdir()
    save_tensors({"w": torch.arange(4.0)}, folder / "learner" / "weights.pt")


def test_complete_checkpoints_are_renamed_into_place_and_the_last_k_kept(tmp_path):
    for step in (2, 4, 6, 8):
        path = write_checkpoint(tmp_path, state(step), write_tensor, keep=2)
        assert path == tmp_path / f"step_{step:06d}"
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step_000006", "step_000008"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000006", "step_000008"]  # no partial left
    assert read_state(latest_checkpoint(tmp_path)) == state(8)
    assert torch.equal(load_tensors(tmp_path / "step_000008" / "learner" / "weights.pt")["w"], torch.arange(4.0))


def test_a_crash_mid_write_leaves_the_previous_checkpoint_and_is_never_read(tmp_path):
    write_checkpoint(tmp_path, state(2), write_tensor, keep=3)

    def crash(folder: Path) -> None:
        write_tensor(folder)
        raise KeyboardInterrupt  # the process is stopped halfway

    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path, state(4), crash, keep=3)
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000002"
    # A partial folder left by a killed process (no state.json) is not a checkpoint, and goes on the next write.
    stale = tmp_path / ".step_000004.partial"
    (stale / "learner").mkdir(parents=True)
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000002"
    write_checkpoint(tmp_path, state(6), write_tensor, keep=3)
    assert not stale.exists() and latest_checkpoint(tmp_path).name == "step_000006"


def test_a_full_disk_is_one_clear_error_and_the_previous_checkpoint_survives(tmp_path):
    # /dev/full answers every write with ENOSPC, as a full disk does.
    write_checkpoint(tmp_path, state(2), write_tensor, keep=3)

    def write_to_full_disk(folder: Path) -> None:
        write_tensor(folder)
        os.symlink("/dev/full", folder / "optimizer.pt")
        save_tensors({"w": torch.zeros(100_000)}, folder / "optimizer.pt")

    with pytest.raises(CheckpointError) as err:
        write_checkpoint(tmp_path, state(4), write_to_full_disk, keep=3)
    message = str(err.value)
    assert message.startswith("no space left on the device while writing checkpoint step 4")
    assert "step_000002 is intact" in message and "\n" not in message
    assert [p.name for p in tmp_path.iterdir()] == ["step_000002"]
    assert read_state(tmp_path / "step_000002") == state(2)


class RunsACommand:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_loading_refuses_pickled_code_and_does_not_run_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open("evil.pt", "wb") as out:
        pickle.dump({"w": RunsACommand()}, out)
    with pytest.raises(CheckpointError, match="holds more than tensors and plain data, refused"):
        load_tensors(tmp_path / "evil.pt")
    assert not (tmp_path / "pwned").exists()


def test_recipe_hash_ignores_where_the_run_runs_but_not_what_it_trains():
    recipe = {"seed": 0, "learner": {"lr": 1e-4}, "ray": {"address": None}}
    assert recipe_hash(recipe) == recipe_hash({**recipe, "ray": {"address": "10.0.0.1:6379"}})
    assert recipe_hash(recipe) == recipe_hash({**recipe, "output_dir": "/moved/elsewhere"})
    assert recipe_hash(recipe) != recipe_hash({**recipe, "learner": {"lr": 2e-4}})


def test_resume_point_modes(tmp_path):
    root = tmp_path / "checkpoints"
    assert resume_point(root, "auto", ABC) is None
    with pytest.raises(CheckpointError, match="--resume: there is no complete checkpoint under"):
        resume_point(root, "require", ABC)
    write_checkpoint(root, state(2), write_tensor, keep=3)
    assert resume_point(root, "auto", ABC) == root / "step_000002"
    assert resume_point(root, "never", ABC) is None
    with pytest.raises(CheckpointError, match="was written by a different recipe"):
        resume_point(root, "auto", RecipeHashes("def", "old"))
    moved = set_aside(root, "then")
    assert moved.name == "checkpoints.replaced-then" and (moved / "step_000002" / "state.json").exists()
    assert resume_point(root, "auto", ABC) is None


def test_a_checkpoint_from_before_format_2_is_checked_against_the_legacy_hash(tmp_path):
    root = tmp_path / "checkpoints"
    write_checkpoint(root, state(2, recipe="old", hash_version=1), write_tensor, keep=3)
    assert resume_point(root, "auto", ABC) == root / "step_000002"
    with pytest.raises(CheckpointError, match="was written by a different recipe"):
        resume_point(root, "auto", RecipeHashes("abc", None))  # a field added since is set: cannot match


def test_recipe_hashes_ignore_defaults_and_fields_added_since_format_1():
    full = {"seed": 0, "learner": {"lr": 1e-4, "lr_schedule": "constant"}}
    at_defaults = {"learner": {"lr": 1e-4}}  # seed 0 and lr_schedule constant are defaults
    hashes = recipe_hashes(full, at_defaults, added=("learner.lr_schedule",))
    # Format 1 hashed the whole config of its day, which had no lr_schedule.
    assert hashes.legacy == recipe_hash({"seed": 0, "learner": {"lr": 1e-4}})
    assert hashes.current == recipe_hash(at_defaults)
    # Adding a field whose default keeps behaviour leaves the current hash as it was.
    assert recipe_hashes({**full, "new": 1}, at_defaults).current == hashes.current
    # A recipe that sets a field the old code did not have cannot be the one an old checkpoint ran.
    set_since = {"learner": {"lr": 1e-4, "lr_schedule": "cosine"}}
    assert recipe_hashes(full, set_since, added=("learner.lr_schedule",)).legacy is None


def test_fields_added_to_list_items_are_named_with_brackets():
    full = {"stages": [{"name": "a", "lr": None}, {"name": "b", "lr": None}]}
    hashes = recipe_hashes(full, {"stages": [{"name": "a"}, {"name": "b"}]}, added=("stages[].lr",))
    assert hashes.legacy == recipe_hash({"stages": [{"name": "a"}, {"name": "b"}]})
    assert recipe_hashes(full, {"stages": [{"name": "a", "lr": 0.1}]}, added=("stages[].lr",)).legacy is None


def test_an_unreadable_state_file_names_the_folder(tmp_path):
    folder = tmp_path / "step_000002"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps({"step": 2}))
    with pytest.raises(CheckpointError, match="step_000002/state.json cannot be read"):
        read_state(folder)


def test_a_state_file_from_before_the_kl_controller_still_reads(tmp_path):
    # state.json as written before TrainerState.kl_controller existed: the key is absent.
    folder = tmp_path / "step_000003"
    folder.mkdir()
    old = {k: v for k, v in asdict(state(3)).items() if k != "kl_controller"}
    (folder / "state.json").write_text(json.dumps(old))
    loaded = read_state(folder)
    assert loaded.kl_controller is None and loaded.step == 3
