"""Checkpoints on disk: atomic writes, the last K kept, the newest complete one found again.

    output_dir/checkpoints/
      step_000020/             complete: renamed into place only after every part was written
        state.json             the driver's state (step, stage, data cursor, MLflow run ids, ...)
        learner/               DeepSpeed checkpoint of every learner rank (model, optimizer, RNG)
        reference/             the reference model, only once it was refreshed from the policy
      .step_000030.partial/    being written (or left by a crash): never read, removed on the next write

A crash or a full disk mid-write leaves the previous checkpoint as it was. Loading never unpickles
arbitrary objects: state is JSON, tensors are read with `torch.load(weights_only=True)` and the
few plain DeepSpeed classes its optimizer state holds are allowlisted by name.

No Ray here: the driver passes a function that makes the actors write their parts into the folder.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from grpo_ray.config import Config, config_to_dict
from grpo_ray.config.paths import relative_paths
from grpo_ray.models.tensor_files import CheckpointError, os_error

STATE_FILE = "state.json"
_NAME = re.compile(r"^step_(\d{6,})$")


@dataclass
class TrainerState:
    """What the driver needs to continue exactly where a checkpoint was taken (JSON as is)."""

    step: int
    stage_index: int  # the stage the next step belongs to
    run_id: str  # MLflow training run: a resumed run logs into it
    stage_run_id: str | None  # the open stage's nested run; None when the next stage starts fresh
    recipe_hash: str  # recipe_hash() of the config that wrote it
    builder: dict[str, Any]  # BatchBuilder.state_dict(): data cursor, ledger, rescue buffer, RNG
    accuracy: dict[str, float] = field(default_factory=dict)  # step (as text) -> held-out accuracy
    skipped_in_a_row: int = 0
    nonfinite_in_a_row: int = 0
    last_metrics: dict[str, float] = field(default_factory=dict)
    finished: bool = False  # written after the last step: nothing left to train
    reference_saved: bool = False
    # KLController.state_dict() (algorithm.kl_controller); None in checkpoints written before it existed.
    kl_controller: dict[str, Any] | None = None
    # 1: recipe_hash over the whole resolved config (checkpoints before 2026-11-24); 2: over the
    # fields that differ from their defaults, so a release that adds a field keeps old runs resumable.
    hash_version: int = 1


HASH_VERSION = 2
# Config fields added since format-1 checkpoints (dotted paths). A format-1 hash covered every field
# of its day, so it is recomputed without these; they must be at their defaults, as the old code ran.
# "stages[].lr" names a field of every item of a list.
ADDED_SINCE_FORMAT_1: tuple[str, ...] = (
    "algorithm.kl_controller",
    # A whole section: listed by its name, or its emptied dict would stay in the legacy hash.
    "environment",
    "distillation",
    "algorithm.kl_horizon",
    "algorithm.kl_target",
    "learner.initial_scale_power",
    "learner.loss_scale",
    "learner.loss_scale_window",
    "learner.lr_schedule",
    "learner.logprob_chunk_tokens",
    "learner.logprob_kernel",
    "learner.max_tokens_per_micro_batch",
    "learner.min_lr",
    "learner.offload_optimizer",
    "learner.offload_params",
    "learner.offload_states_between_updates",
    "learner.packing",
    "learner.warmup_ratio",
    "learner.warmup_steps",
    "model.quantization",
    "reference.model_path",
    "reference.tokenizer",
    "reward.by_source",
    "reward.clip",
    "reward.normalize",
    "reward.source_field",
    "rollout.groups_per_chunk",
    "rollout.vllm.block_size",
    "rollout.vllm.engine_args",
    "rollout.vllm.sleep_level",
    "rollout.vllm.sync_during_generation",
    "stages[].lr",
    "stages[].lr_schedule",
    "train.checkpoint_every_minutes",
    "weight_sync.same_device",
)


@dataclass(frozen=True)
class RecipeHashes:
    current: str  # format 2: the fields that differ from their defaults
    legacy: str | None  # format 1: what an older checkpoint of this recipe recorded; None: none can match
    # Other hashes the same recipe was recorded under (paths written another way, config/paths.py).
    also: tuple[str | None, ...] = ()
    also_legacy: tuple[str | None, ...] = ()


def recipe_hashes(
    full: dict[str, Any], non_default: dict[str, Any], added: tuple[str, ...] = ADDED_SINCE_FORMAT_1
) -> RecipeHashes:
    """full: the resolved config as a dict; non_default: the same without fields at their defaults."""
    set_since = [path for path in added if _has_path(non_default, path)]
    legacy = None if set_since else recipe_hash(_without(full, added))
    return RecipeHashes(recipe_hash(non_default), legacy)


def _has_path(tree: Any, path: str) -> bool:
    head, _, rest = path.partition(".")
    if head.endswith("[]"):
        items = tree.get(head[:-2]) if isinstance(tree, dict) else None
        return isinstance(items, list) and any(_has_path(item, rest) for item in items)
    if not isinstance(tree, dict) or head not in tree:
        return False
    return not rest or _has_path(tree[head], rest)


def _without(tree: Any, paths: tuple[str, ...]) -> Any:
    if not isinstance(tree, dict):
        return tree
    out = dict(tree)
    for path in paths:
        head, _, rest = path.partition(".")
        if head.endswith("[]") and isinstance(out.get(head[:-2]), list):
            out[head[:-2]] = [_without(item, (rest,)) for item in out[head[:-2]]]
        elif head in out and not rest:
            del out[head]
        elif head in out:
            out[head] = _without(out[head], (rest,))
    return out


def recipe_hash(config_dict: dict[str, Any]) -> str:
    """Hash of the recipe without its `ray` section and output_dir: a retried job may run on another
    cluster, and a run's folder may be moved or copied before it goes on."""
    recipe = {key: value for key, value in config_dict.items() if key not in ("ray", "output_dir")}
    return hashlib.sha256(yaml.safe_dump(recipe, sort_keys=True).encode()).hexdigest()[:16]


def checkpoint_step(path: Path) -> int | None:
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else None


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under root, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if checkpoint_step(p) is not None and (p / STATE_FILE).is_file()]
    return sorted(found, key=checkpoint_step)


def latest_checkpoint(root: Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def write_checkpoint(root: Path, state: TrainerState, write_parts: Callable[[Path], None], keep: int) -> Path:
    """Write `state` and the actors' parts into a partial folder, rename it into place, keep `keep`.

    write_parts(folder) writes everything but state.json (the learners' and reference's files).
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{state.step:06d}"
    partial = root / f".{final.name}.partial"
    previous = latest_checkpoint(root)
    try:
        for stale in root.glob(".step_*.partial"):
            shutil.rmtree(stale, ignore_errors=True)
        partial.mkdir()
        write_parts(partial)
        _write_json(partial / STATE_FILE, asdict(state))
        if final.exists():  # the same step again (a stage ended on a checkpoint step): replace it
            shutil.rmtree(final)
        os.rename(partial, final)
    except BaseException as err:
        shutil.rmtree(partial, ignore_errors=True)
        failure = os_error(err)
        if failure is None:
            raise
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
        if failure.errno == errno.ENOSPC:
            raise CheckpointError(
                f"no space left on the device while writing checkpoint step {state.step} under {root}; {kept}; "
                "free disk space or lower train.keep_checkpoints, then resume"
            ) from None
        raise CheckpointError(
            f"could not write checkpoint step {state.step} under {root}: {failure.strerror or failure}; {kept}"
        ) from None
    for old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_state(folder: Path) -> TrainerState:
    try:
        data = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
        return TrainerState(**data)
    except (OSError, ValueError, TypeError) as err:
        raise CheckpointError(
            f"{folder / STATE_FILE} cannot be read ({err}); remove that checkpoint folder to resume from the one before"
        ) from None


def set_aside(root: Path, suffix: str) -> Path | None:
    """Move an existing checkpoints folder out of the way (a fresh run must not resume from it,
    nor delete it): returns where it went."""
    if not root.exists():
        return None
    target = root.with_name(f"{root.name}.replaced-{suffix}")
    os.rename(root, target)
    return target


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with path.open("w", encoding="utf-8") as out:
        json.dump(data, out)
        out.flush()
        os.fsync(out.fileno())


def resume_point(root: Path, mode: str, expected: RecipeHashes) -> Path | None:
    """The checkpoint a run continues from, or None for a fresh start.

    mode "auto": the newest complete checkpoint if there is one (a retried Ray job continues);
    "require" (--resume): one must exist; "never" (--no-resume): start fresh, after moving an
    existing checkpoints folder aside (`checkpoints.replaced-<time>`), never deleting it.
    """
    if mode == "never":
        return None
    latest = latest_checkpoint(root)
    if latest is None:
        if mode == "require":
            raise CheckpointError(f"--resume: there is no complete checkpoint under {root} to resume from")
        return None
    state = read_state(latest)
    if state.hash_version >= HASH_VERSION:
        wanted = {expected.current, *expected.also}
    else:
        wanted = {expected.legacy, *expected.also_legacy} - {None}
    if state.recipe_hash not in wanted:
        raise CheckpointError(
            f"{latest} was written by a different recipe (hash {state.recipe_hash}, this one "
            f"{expected.current}); resume with the "
            "recipe the run started with, set output_dir to a new folder, or pass --no-resume to start over"
        )
    return latest


def run_hashes(cfg: Config) -> RecipeHashes:
    """The recipe's fingerprint, with paths as seen from the working directory (config/paths.py),
    so that a project folder moved or cloned elsewhere keeps resuming; the hash of the paths as
    given is accepted too (checkpoints written before paths were anchored)."""
    full, non_default = config_to_dict(cfg), cfg.model_dump(mode="json", exclude_defaults=True)
    here = Path.cwd()
    portable = recipe_hashes(relative_paths(full, here), relative_paths(non_default, here))
    as_given = recipe_hashes(full, non_default)
    return replace(portable, also=(as_given.current,), also_legacy=(as_given.legacy,))
