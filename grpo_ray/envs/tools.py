"""A tool's JSON schema, the one chat templates take as `tools=` (OpenAI's function format), read
from a Python function: its name, the first paragraph of its docstring, and each parameter's type
(from its annotation) and description (from the docstring's "Args:" section, Google style).

    def multiply(a: int, b: int) -> int:
        '''Multiply two whole numbers.

        Args:
            a: the first factor
            b: the second factor
        '''
    tool_schema(multiply) == {"type": "function", "function": {"name": "multiply",
        "description": "Multiply two whole numbers.", "parameters": {"type": "object",
        "properties": {"a": {"type": "integer", "description": "the first factor"}, ...},
        "required": ["a", "b"]}}}
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from typing import Any

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


def tool_schema(function: Callable) -> dict[str, Any]:
    """The schema of `function` (a plain function or a bound method)."""
    doc = inspect.getdoc(function) or ""
    described = _arg_descriptions(doc)
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: untyped, not an error
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        entry: dict[str, Any] = {}
        kind = _json_type(hints.get(name))
        if kind:
            entry["type"] = kind
        if name in described:
            entry["description"] = described[name]
        properties[name] = entry
        if parameter.default is parameter.empty:
            required.append(name)
    description = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": function.__name__, "description": description, "parameters": parameters},
    }


def _json_type(annotation: Any) -> str | None:
    origin = typing.get_origin(annotation) or annotation
    if origin in _JSON_TYPES:
        return _JSON_TYPES[origin]
    arguments = [a for a in typing.get_args(annotation) if a is not type(None)]
    return _json_type(arguments[0]) if len(arguments) == 1 else None  # Optional[X] is X


def _arg_descriptions(doc: str) -> dict[str, str]:
    """{parameter: description} from a docstring's "Args:" section (continuation lines joined)."""
    match = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?|\s*\n)*)", doc, re.M)
    if not match:
        return {}
    found: dict[str, str] = {}
    current = None
    for line in match.group(1).splitlines():
        entry = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?\s*:\s*(.*)", line)
        if entry and (current is None or len(line) - len(line.lstrip()) <= _indent(match.group(1))):
            current = entry.group(1)
            found[current] = entry.group(2).strip()
        elif current and line.strip():
            found[current] = f"{found[current]} {line.strip()}"
    return found


def _indent(block: str) -> int:
    first = next((line for line in block.splitlines() if line.strip()), "")
    return len(first) - len(first.lstrip())
