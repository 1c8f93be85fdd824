"""Loading the user's code named in a recipe as "package.module:name" or "path/to/file.py:name"
(reward functions, environments): one loader, so both are found, named and refused alike.

A file is loaded once per process under a name derived from its resolved path: loading it twice
reuses the module, and two files with the same stem never collide. Errors are `error_type(message)`
with a one-line message that starts with `what` ("reward spec 'x.py:f'", "environment 'x.py:Env'").
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from grpo_ray.errors import first_line, missing_path_hint


def is_file_spec(spec: str) -> bool:
    location = spec.rpartition(":")[0]
    return location.endswith(".py") or "/" in location or "\\" in location


def load_attribute(spec: str, what: str, error_type: type[Exception], kind: str = "function") -> Any:
    """The object `spec` names (dotted attributes reach into classes: "mod:Scorer.score")."""
    location, _, attribute = spec.rpartition(":")
    if not location or not attribute:
        raise error_type(f"{what} needs both parts: 'package.module:{kind}' or 'path/to/file.py:{kind}'")
    module = _from_file(location, what, error_type) if is_file_spec(spec) else _from_module(location, what, error_type)
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise error_type(f"{what}: {location!r} has no attribute {attribute!r}; check the {kind} name")
        target = getattr(target, part)
    return target


def _from_file(path_text: str, what: str, error_type: type[Exception]):
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise error_type(f"{what}: file {str(path)!r} not found {missing_path_hint()}; check the path")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    name = f"_grpo_ray_user_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise error_type(f"{what}: {str(path)!r} is not a loadable Python file")
    module = importlib.util.module_from_spec(module_spec)
    # Registered before running, as importlib's recipe does, so dataclasses and pickling inside
    # the file can find their module.
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise error_type(
            f"{what}: importing {str(path)!r} failed ({first_line(error, with_type=True)}); fix the file"
        ) from error
    return module


def _from_module(module_name: str, what: str, error_type: type[Exception]):
    try:
        return importlib.import_module(module_name)
    except Exception as error:
        raise error_type(
            f"{what}: module {module_name!r} not importable ({first_line(error, with_type=True)}); "
            "check that it is installed or on PYTHONPATH"
        ) from error
