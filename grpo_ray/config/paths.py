"""One rule for relative paths: a path written in a recipe is relative to the recipe file's folder;
a path given with --set is relative to the working directory the command runs in.

Recipe tools users know resolve a file's paths against the file (docker compose, GitHub workflows'
`uses: ./...`), so a recipe and its data, reward file and outputs move together and run the same
from any folder. `--set` values are command-line arguments, which every shell tool reads against
the working directory. `load_config` makes every local path absolute by that rule, once, so no
later layer ever looks at the working directory; `ray job submit --working-dir .` keeps working,
since the job's driver reads the recipe inside the uploaded folder and the paths resolve there.

What counts as a local path, per field (hub ids, built-ins, URIs and built-in models pass unchanged):
    output_dir                                   always
    model.path / .tokenizer, reference.model_path / .tokenizer, reward.model.path / .tokenizer,
    distillation.teachers[].model_path / .tokenizer
                                                 local unless it looks like a hub id ("org/name",
                                                 one slash, not present locally) or is a built-in
                                                 model ("tiny", "gemma3-270m": builtin_names.py)
    data.train_files[] / eval_files[]            a file with a data suffix, or anything present
                                                 locally; "tiny:...", "smollm2-135m:..." and hub ids pass
    reward.functions[].name, reward.by_source.*[].name, environment.spec
                                                 the file part of "path/file.py:function"
    tracking.tracking_uri                        sqlite:///relative.db and a bare folder
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_ray.builtin_names import BUILT_IN_DATA_PREFIXES, BUILT_IN_MODELS

DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow")
_MODEL_FIELDS = (("model", "path"), ("model", "tokenizer"), ("reference", "model_path"), ("reference", "tokenizer"))
_REWARD_MODEL_FIELDS = ("path", "tokenizer")
_TEACHER_MODEL_FIELDS = ("model_path", "tokenizer")


def anchor_paths(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """The raw recipe with every relative local path made absolute against `base` (a new dict)."""
    return map_paths(raw, lambda value, local: _absolute(value, base) if local(base) else value)


def relative_paths(raw: dict[str, Any], start: Path) -> dict[str, Any]:
    """The inverse view for a recipe's fingerprint: absolute paths under `start` written relative to
    it, so that a project folder moved or cloned elsewhere keeps its checkpoints' recipe hash."""

    def relative(value: str, local: Callable[[Path], bool]) -> str:
        path = _file_part(value)
        if not os.path.isabs(path):
            return value
        inside = os.path.relpath(path, start)
        return value if inside.startswith("..") else value.replace(path, inside, 1)

    return map_paths(raw, relative)


def map_paths(raw: dict[str, Any], change: Callable[[str, Callable[[Path], bool]], str]) -> dict[str, Any]:
    """A copy of `raw` with change(value, is_local) applied to every path field's string value;
    is_local(base) tells whether the value names something local when read against `base`."""
    out = {key: (dict(value) if isinstance(value, dict) else value) for key, value in raw.items()}

    def apply(value: Any, local: Callable[[str, Path], bool]) -> Any:
        return change(value, lambda base: local(value, base)) if isinstance(value, str) else value

    if "output_dir" in out:
        out["output_dir"] = apply(out["output_dir"], lambda value, base: True)
    for section, key in _MODEL_FIELDS:
        if isinstance(out.get(section), dict) and key in out[section]:
            out[section][key] = apply(out[section][key], _local_model)
    data = out.get("data")
    if isinstance(data, dict):
        for key in ("train_files", "eval_files"):
            if isinstance(data.get(key), (list, tuple)):
                data[key] = [apply(spec, _local_data) for spec in data[key]]
    reward = out.get("reward")
    if isinstance(reward, dict):
        out["reward"] = _map_reward(reward, apply)
    distillation = out.get("distillation")
    if isinstance(distillation, dict) and isinstance(distillation.get("teachers"), (list, tuple)):
        distillation["teachers"] = [
            {key: apply(value, _local_model) if key in _TEACHER_MODEL_FIELDS else value for key, value in item.items()}
            if isinstance(item, dict)
            else item
            for item in distillation["teachers"]
        ]
    environment = out.get("environment")
    if isinstance(environment, dict) and isinstance(environment.get("spec"), str):
        out["environment"]["spec"] = apply(environment["spec"], _local_reward)
    tracking = out.get("tracking")
    if isinstance(tracking, dict) and isinstance(tracking.get("tracking_uri"), str):
        tracking["tracking_uri"] = apply(tracking["tracking_uri"], _local_store)
    return out


def _map_reward(reward: dict[str, Any], apply: Callable) -> dict[str, Any]:
    reward = dict(reward)

    def functions(items: Any) -> Any:
        if not isinstance(items, (list, tuple)):
            return items
        return [{**item, "name": apply(item["name"], _local_reward)} if _named(item) else item for item in items]

    if "functions" in reward:
        reward["functions"] = functions(reward["functions"])
    if isinstance(reward.get("by_source"), dict):
        reward["by_source"] = {source: functions(items) for source, items in reward["by_source"].items()}
    model = reward.get("model")
    if isinstance(model, dict):
        reward["model"] = {
            key: apply(value, _local_model) if key in _REWARD_MODEL_FIELDS else value for key, value in model.items()
        }
    return reward


def _named(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("name"), str)


def _local_model(value: str, base: Path) -> bool:
    if value in BUILT_IN_MODELS or not value.strip():
        return False
    return value.startswith((".", "/", "~")) or value.count("/") != 1 or (base / value).exists()


def _local_data(value: str, base: Path) -> bool:
    if value.startswith(BUILT_IN_DATA_PREFIXES) or "://" in value or not value.strip():
        return False
    return value.startswith((".", "/", "~")) or value.endswith(DATA_SUFFIXES) or (base / value).exists()


def _local_reward(value: str, base: Path) -> bool:
    location, colon, _ = value.rpartition(":")
    return bool(colon and location) and (location.endswith(".py") or "/" in location or "\\" in location)


def _local_store(value: str, base: Path) -> bool:
    if value.startswith("sqlite:///"):
        return not value.startswith("sqlite:////") and value != "sqlite:///:memory:"
    return "://" not in value and not value.startswith("file:")


def _file_part(value: str) -> str:
    """The path inside a value: the file of "file.py:function", the database of a sqlite URI."""
    if value.startswith("sqlite:///"):
        return value.removeprefix("sqlite:///")
    location, colon, attribute = value.rpartition(":")
    if colon and location and "/" not in attribute and not attribute.startswith("\\"):
        return location
    return value


def _absolute(value: str, base: Path) -> str:
    path = _file_part(value)
    # abspath, not resolve(): ".." is folded but a symlinked folder keeps the name the user gave it.
    anchored = os.path.abspath(os.path.join(base, os.path.expanduser(path)))
    if value.startswith("sqlite:///"):
        return "sqlite:///" + anchored
    return value.replace(path, anchored, 1) if path != value else anchored
