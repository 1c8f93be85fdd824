"""Checkpoint folders on a real filesystem: atomic rename, the last K, a full disk, safe loading."""

import json
import os
import pickle
import typing
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from grpo_ray.models.tensor_files import load_tensors, save_tensors
from grpo_ray.training.checkpoint import (
    ADDED_SINCE_FORMAT_1,
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
    return TrainerState(
        step=step,
        stage_index=0,
        run_id="run",
        stage_run_id=None,
        recipe_hash=recipe,
        builder={"batches_drawn": step},
        accuracy={"0": 0.25},
        hash_version=hash_version,
    )


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


# Every config field of format 1's day (74293a5, the last format-1 code), as dotted paths.
FORMAT_1_FIELDS = set(
    """
algorithm.advantage algorithm.clip_high algorithm.clip_low algorithm.dual_clip
algorithm.dynamic_sampling algorithm.dynamic_sampling_max_tries algorithm.entropy_coef
algorithm.epochs_per_batch algorithm.kl_coef algorithm.kl_estimator algorithm.kl_placement
algorithm.loss_aggregation algorithm.normalize_by_std algorithm.overlong algorithm.overlong_buffer
algorithm.overlong_penalty algorithm.staleness_is_cap algorithm.tis_cap data.answer_field
data.apply_chat_template data.difficulty_band data.eval_files data.eval_limit data.instruction
data.max_prompt_tokens data.prompt_field data.train_files data.val_fraction learner.betas
learner.grad_clip learner.gradient_checkpointing learner.lr learner.micro_batch_size
learner.node_labels learner.num_cpus learner.num_gpus learner.num_workers learner.resources
learner.share_prompts learner.torch_threads learner.weight_decay learner.zero_stage model.dtype
model.lora.alpha model.lora.dropout model.lora.enabled model.lora.rank model.lora.target_modules
model.path model.tokenizer output_dir placement.colocate placement.strategy
polaris.correct_threshold polaris.drop_easy_threshold polaris.rescue polaris.substitution
ray.address ray.dashboard ray.dashboard_host ray.max_actor_restarts ray.metrics_export_port
ray.node_ip ray.num_cpus ray.placement_timeout_s reference.node_labels reference.num_cpus
reference.num_gpus reference.refresh_every reference.resources reward.failure_window_steps
reward.functions[].name reward.functions[].options reward.functions[].weight reward.isolation
reward.max_failure_rate reward.memory_limit_mb reward.model.batch_size reward.model.max_length
reward.model.node_labels reward.model.num_cpus reward.model.num_gpus reward.model.path
reward.model.resources reward.model.tokenizer reward.model.weight reward.node_labels reward.num_cpus
reward.num_workers reward.processes_per_worker reward.resources reward.timeout_s rollout.backend
rollout.max_new_tokens rollout.max_staleness rollout.node_labels rollout.num_cpus rollout.num_gpus
rollout.num_workers rollout.resources rollout.samples_per_prompt rollout.temperature
rollout.tensor_parallel_size rollout.top_k rollout.top_p rollout.torch_threads
rollout.vllm.cpu_kv_cache_gb rollout.vllm.enforce_eager rollout.vllm.gpu_memory_utilization
rollout.vllm.max_model_len seed stages[].eval_temperature
stages[].max_new_tokens stages[].name stages[].steps stages[].temperature stages[].top_p
tracking.experiment tracking.run_name tracking.samples_every tracking.samples_per_table
tracking.tracking_uri train.checkpoint_every train.eval_every train.eval_samples
train.eval_temperature train.keep_checkpoints train.max_nonfinite_updates train.max_skipped_batches
train.prompts_per_step train.steps train.stop_at_accuracy weight_sync.bucket_mb
weight_sync.lora_adapter_only weight_sync.measure_raw_broadcast weight_sync.probe_every
weight_sync.probe_tolerance weight_sync.timeout_s
""".split()
)


def _field_paths(model: type, prefix: str = "") -> set[str]:
    """Dotted paths of every leaf field of a pydantic config class ("stages[].lr" for list items)."""
    from pydantic import BaseModel

    paths = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        inner = [
            a
            for a in (typing.get_args(annotation) or (annotation,))
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if not inner:
            paths.add(prefix + name)
        else:
            paths |= _field_paths(inner[0], f"{prefix}{name}{'[]' if typing.get_origin(annotation) is tuple else ''}.")
    return paths


def test_every_config_field_added_since_format_1_is_listed_for_the_legacy_hash():
    # A format-1 checkpoint's hash covered every field of its day: a field added since and not in
    # ADDED_SINCE_FORMAT_1 changes the recomputed hash, and every such checkpoint refuses to resume
    # ("written by a different recipe"), as rollout.vllm.sync_during_generation did until listed.
    from grpo_ray.config.schema import Config

    fields = _field_paths(Config)
    assert (
        "stages[].lr" in fields and "rollout.vllm.gpu_memory_utilization" in fields
    )  # the walk reaches lists and nesting
    added = {p for p in fields if any(p == a or p.startswith(a + ".") for a in ADDED_SINCE_FORMAT_1)}
    assert not sorted(fields - added - FORMAT_1_FIELDS), (
        "config fields added since format 1: list them in ADDED_SINCE_FORMAT_1"
    )
    assert not sorted(FORMAT_1_FIELDS - fields), "format-1 fields removed: a legacy hash can no longer be recomputed"
