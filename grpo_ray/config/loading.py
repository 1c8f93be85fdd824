"""Loading recipes: YAML and `--set` overrides in, a checked `Config` out, or a `ConfigError`
(one line per wrong field)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from grpo_ray.config.paths import anchor_paths
from grpo_ray.config.checks import check_config
from grpo_ray.config.schema import Config, ConfigError

# Found by fuzzing: PyYAML's safe constructors raise far more than YAMLError on bad text:
# ValueError ("2001-02-30", "!!int abc"), IndexError ("!!float"), KeyError ("!!bool"),
# AttributeError ("!!timestamp abc"), RecursionError ("[[[[..." deeper than Python's stack).
# Every failure of safe_load means "not valid YAML"; it runs no code of ours.
_YAML_FAILURES = (Exception,)


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML recipe, apply `dotted.key=value` overrides, validate; ConfigError on any problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found; pass the path of a YAML recipe such as configs/tiny.yaml")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except UnicodeDecodeError:
        # Found by fuzzing: a binary or non-UTF-8 file raised UnicodeDecodeError.
        raise ConfigError(f"{path}: not UTF-8 text; pass a YAML recipe") from None
    except _YAML_FAILURES as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}; fix the syntax") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, data:, ...)")
    # config/paths.py: the recipe's relative paths against its folder, then --set's against the working directory.
    # absolute(), not resolve(): a recipe reached through a symlinked folder is read where the user put it.
    return config_from_mapping(anchor_paths(raw, path.absolute().parent), overrides)


def config_from_mapping(raw: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """A recipe given as a dict (the Python API), with `dotted.key=value` overrides; its relative
    paths, like --set's, are relative to the working directory."""
    raw = copy.deepcopy(dict(raw))
    for override in overrides:
        _apply_override(raw, override)
    return config_from_dict(anchor_paths(raw, Path.cwd()))


def config_from_dict(raw: dict[str, Any]) -> Config:
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as err:
        lines = tuple(_error_line(error) for error in err.errors())
        more = len(lines) - 1
        summary = lines[0] + (f" (and {more} more error{'s' if more > 1 else ''})" if more else "")
        raise ConfigError(summary, lines) from None
    check_config(cfg)
    return cfg


def _apply_override(raw: dict[str, Any], override: str) -> None:
    key, sep, value = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {override!r}: expected dotted.key=value, e.g. --set train.steps=10")
    parts = key.strip().split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {_shown(key)}: {_shown(part)} is not a section")
        node = child
    # YAML parsing gives "10" -> 10, "true" -> True, "[a, b]" -> list, like the file itself.
    try:
        node[parts[-1]] = yaml.safe_load(value)
    except _YAML_FAILURES:
        node[parts[-1]] = value


def _error_line(error: Any) -> str:
    """One of pydantic's errors as one line: the field, what is wrong, and what was given."""
    field = ".".join(_shown(str(p)) for p in error["loc"]) or "config"
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        parent = ".".join(_shown(str(p)) for p in error["loc"][:-1])
        allowed = _allowed_keys(error["loc"][:-1])
        message = f"unknown key{' in ' + parent if parent else ''}; allowed: {', '.join(allowed)}"
    elif "input" in error and error["type"] != "missing":
        message = f"{message} (got {_got(error['input'])})"
    return f"{field}: {message}"


def _got(value: Any) -> str:
    try:
        return repr(value)
    except ValueError:
        # Found by fuzzing: an int of over 4300 digits (YAML reads "0x" + 4000 hex digits) has no repr.
        return f"a {type(value).__name__} too large to show"


def _shown(key: str) -> str:
    """A user's key as a message shows it: found by fuzzing, a key holding a line break split the
    one-line error, so non-printable characters are escaped ("a\\nb")."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in key)


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = Config
    for part in loc:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[part].annotation
        # tuple[RewardFunctionConfig, ...] -> RewardFunctionConfig
        args = getattr(annotation, "__args__", None)
        model = args[0] if args else annotation
    return sorted(model.model_fields)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain, YAML-safe dict of the resolved config (enums as their values)."""
    return cfg.model_dump(mode="json")


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; used for MLflow params and printing."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat
