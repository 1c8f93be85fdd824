"""The configuration reference: every key of the recipe, generated from the schema.

The types, defaults and bounds come from the pydantic models; each key's description is the `#` comment
written above its field in the source (grpo_ray/config/: schema.py, role_sections.py, base.py), read with
`tokenize` and `ast`, so that editing a comment edits the reference. docs/configuration.md is this module's
output, and a unit test fails when the two differ:

    python -m grpo_ray.commands.config_reference > docs/configuration.md
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import sys
import tokenize
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from grpo_ray.config.schema import Config, RewardConfig
from grpo_ray.data import formats

COMMAND = "python -m grpo_ray.commands.config_reference > docs/configuration.md"
NO_COMMENT = "*(no comment in the source)*"
_TABLE_HEAD = "| Key | Type | Default | Constraints | Description |\n| --- | --- | --- | --- | --- |"
# Bounds and lengths as pydantic keeps them in a field's metadata (annotated_types and its own pattern holder).
_BOUNDS = (("ge", "≥ {}"), ("gt", "> {}"), ("le", "≤ {}"), ("lt", "< {}"))
_LENGTHS = (("min_length", "length ≥ {}"), ("max_length", "length ≤ {}"), ("pattern", "pattern `{}`"))


def config_reference(sources: Mapping[str, str] | None = None) -> str:
    """The Markdown reference of every key of `Config`, section by section in schema order.

    `sources` maps a module name (grpo_ray.config.schema) to its source text, for reading the comments
    from an edited copy; by default each section class's own module is read.
    """
    comment_of = _CommentReader(sources or {})
    parts = [_preamble()]
    for path, model, depth in _sections(Config, "", 0):
        parts.append(_section(path, model, depth, comment_of))
    parts.append(_data_fields())
    return "\n\n".join(parts) + "\n"


def field_comments(source: str) -> dict[str, dict[str, str]]:
    """Class name -> field name -> the `#` comment block directly above the field (its lines joined by a
    space), "" where there is none. Only annotated fields (`name: type = default`) are read."""
    comment_lines = _comment_lines(source)
    found: dict[str, dict[str, str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        fields = found.setdefault(node.name, {})
        for statement in node.body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                above, line = [], statement.lineno - 1
                while line in comment_lines:
                    above.insert(0, comment_lines[line])
                    line -= 1
                fields[statement.target.id] = " ".join(above)
    return found


def _comment_lines(source: str) -> dict[int, str]:
    """Line number -> text of each line that holds only a comment (a `#` inside a string is no comment)."""
    lines = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and not token.line[: token.start[1]].strip():
            text = token.string[1:]
            lines[token.start[0]] = (text[1:] if text.startswith(" ") else text).rstrip()
    return lines


class _CommentReader:
    """The comment of a model's field, read from the module of the class that declares it (a role's
    `resources` is declared in base.py), each module parsed once."""

    def __init__(self, sources: Mapping[str, str]):
        self._sources = sources
        self._parsed: dict[str, dict[str, dict[str, str]]] = {}

    def __call__(self, model: type[BaseModel], name: str) -> str:
        owner = _declaring_class(model, name)
        module = owner.__module__
        if module not in self._parsed:
            source = self._sources.get(module)
            self._parsed[module] = field_comments(source if source is not None else _module_source(module))
        return self._parsed[module].get(owner.__name__, {}).get(name, "")


def _module_source(module: str) -> str:
    return inspect.getsource(sys.modules[module])


def _declaring_class(model: type[BaseModel], name: str) -> type:
    return next(k for k in model.__mro__ if name in vars(k).get("__annotations__", {}))


def _ordered_fields(model: type[BaseModel]) -> list[tuple[str, FieldInfo]]:
    """The model's fields in source order, its own before those it inherits (pydantic puts the base's first)."""
    fields = list(model.model_fields.items())
    return sorted(fields, key=lambda item: _declaring_class(model, item[0]) is not model)


# ---------------------------------------------------------------- walking the schema


def _sections(model: type[BaseModel], path: str, depth: int) -> Iterator[tuple[str, type[BaseModel], int]]:
    """(dotted path, model, depth) of the model and of every section below it, depth first."""
    yield path, model, depth
    for name, field in _ordered_fields(model):
        for sub_path, sub_model in _models_in(field.annotation, _join(path, name)):
            yield from _sections(sub_model, sub_path, depth + 1)


def _models_in(annotation: Any, key: str) -> list[tuple[str, type[BaseModel]]]:
    """The sections a field's type holds, by path: `key` itself, `key[]` for a list's entries, `key.<key>`
    for a mapping's values."""
    annotation = _unannotated(annotation)
    if _is_section(annotation):
        return [(key, annotation)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tuple and args[-1:] == (Ellipsis,):
        return _models_in(args[0], key + "[]")
    if origin is dict:
        return _models_in(args[1], key + ".<key>")
    if origin in (typing.Union, types.UnionType):
        return [found for arg in args for found in _models_in(arg, key)]
    return []


def _is_section(annotation: Any) -> bool:
    # Python 3.10 takes `tuple[int, ...]` for a class, and issubclass then raises.
    return typing.get_origin(annotation) is None and isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _unannotated(annotation: Any) -> Any:
    return typing.get_args(annotation)[0] if typing.get_origin(annotation) is typing.Annotated else annotation


# ---------------------------------------------------------------- rendering


def _preamble() -> str:
    return (
        "# Configuration reference\n\n"
        f"Generated from `grpo_ray/config/` by `{COMMAND}`: edit the field comments there, not this file.\n\n"
        "A key is a dotted path in the YAML recipe (`train.steps` is `steps:` under `train:`), the same one that "
        "`--set train.steps=10` takes. `[]` stands for each entry of a list and `<key>` for any key of a mapping. "
        'A type such as `"hf" | "vllm"` lists the allowed values; defaults are written as YAML (`null`: none); '
        "constraints are the bounds the schema checks at load."
    )


def _section(path: str, model: type[BaseModel], depth: int, comment_of: Callable[..., str]) -> str:
    title = f"`{path}`" if path else "Top level"
    where = f"`{model.__name__}` in `{model.__module__.replace('.', '/')}.py`"
    if path.endswith("[]"):
        where = f"Each entry of the list `{path[:-2]}`: {where}"
    rows = [_row(_join(path, name), field, comment_of(model, name)) for name, field in _ordered_fields(model)]
    return "\n".join([f"{'#' * min(depth + 2, 4)} {title}", "", where + ".", "", _TABLE_HEAD, *rows])


def _row(key: str, field: FieldInfo, comment: str) -> str:
    description = _markdown(comment) if comment else NO_COMMENT
    sections = _models_in(field.annotation, key)
    if sections:
        links = ", ".join(f"[`{path}`](#{_anchor(path)})" for path, _ in sections)
        description = f"{description} See {links}." if comment else f"See {links}."
    is_section = isinstance(field.get_default(call_default_factory=True), BaseModel)
    default = "—" if is_section else _default(field)
    cells = [f"`{key}`", _code(_type_text(field.annotation)), default, _constraints(field), description]
    return "| " + " | ".join(cells) + " |"


def _type_text(annotation: Any) -> str:
    """A field's type as a YAML writer reads it: `int`, `float | None`, `"hf" | "vllm"`, `list[str]`."""
    annotation = _unannotated(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None) or annotation is None:
        return "None"
    if annotation is Any:
        return "any"
    if _is_section(annotation):
        return "mapping"
    if origin is typing.Literal:
        return " | ".join(json.dumps(value) for value in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(arg) for arg in args)
    if origin is tuple and args[-1:] == (Ellipsis,):
        return f"list[{_type_text(args[0])}]"
    if origin is tuple:
        return "[" + ", ".join(_type_text(arg) for arg in args) + "]"
    if origin is dict:
        return f"dict[{_type_text(args[0])}, {_type_text(args[1])}]"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    text = yaml.safe_dump(
        _plain(field.get_default(call_default_factory=True)), default_flow_style=True, width=1000, sort_keys=False
    )
    return _code(text.strip().removesuffix("...").strip())


def _plain(value: Any) -> Any:
    """A default as YAML holds it: tuples as lists, sections as mappings."""
    if isinstance(value, BaseModel):
        return _plain(dict(value))
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _constraints(field: FieldInfo) -> str:
    """The field's bounds, and those on the keys and values of a mapping (`resources`: values > 0)."""
    found = _bounds(field.metadata)
    annotation = _unannotated(field.annotation)
    if typing.get_origin(annotation) is dict:
        for part, arg in zip(("keys", "values"), typing.get_args(annotation)):
            if typing.get_origin(arg) is typing.Annotated and (inner := _bounds(typing.get_args(arg)[1:])):
                found.append(f"{part}: {', '.join(inner)}")
    return ", ".join(found)


def _bounds(metadata: typing.Iterable[Any]) -> list[str]:
    found = []
    for item in metadata:
        for entry in item.metadata if isinstance(item, FieldInfo) else [item]:
            found += [text.format(getattr(entry, name)) for name, text in _BOUNDS + _LENGTHS if hasattr(entry, name)]
    return found


def _code(text: str) -> str:
    # A `|` ends a table cell even inside a code span unless escaped (GitHub's tables).
    return "`" + text.replace("|", "\\|") + "`"


def _markdown(text: str) -> str:
    """Comment text for a table cell: code spans kept; outside them `\\`, `|`, `<` and `*` escaped, so a
    `<output_dir>` is not taken for HTML nor `a * b * c` for emphasis."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        for char in "\\|<*":
            parts[i] = parts[i].replace(char, "\\" + char)
    for i in range(1, len(parts), 2):
        parts[i] = parts[i].replace("|", "\\|")
    return "`".join(parts)


def _anchor(path: str) -> str:
    """GitHub's anchor of the heading `path`: lower case, punctuation other than `-` and `_` dropped."""
    return "".join(char for char in path.lower() if char.isalnum() or char in "-_")


def _data_fields() -> str:
    """The row shapes the data loaders read, from grpo_ray/data/formats.py's parsers and field constants."""
    source_field = RewardConfig.model_fields["source_field"].default
    rows = [f"| `{fmt.value}` | {_markdown(_docstring(parser))} |" for fmt, parser in formats.ROW_PARSERS.items()]
    prompts = ", ".join(f"`{name}`" for name in formats.GENERIC_PROMPT_FIELDS)
    answers = ", ".join(f"`{name}`" for name in formats.GENERIC_ANSWER_FIELDS)
    return "\n".join(
        [
            "## Data fields",
            "",
            "Each row of `data.train_files` and `data.eval_files` is read in one of these formats, detected per row "
            "from the fields it has (`grpo_ray/data/formats.py`):",
            "",
            "| Format | Fields |",
            "| --- | --- |",
            *rows,
            "",
            f"A generic row's prompt is the first present of {prompts}; its answer the first present of {answers}. "
            "`data.prompt_field` and `data.answer_field` name other fields (and make every row generic).",
            "",
            "Every other field of a row reaches the reward functions as a keyword argument; "
            f"`reward.source_field` (default `{source_field}`) names the one that picks a `reward.by_source` entry.",
        ]
    )


def _docstring(function: Callable[..., Any]) -> str:
    return " ".join(inspect.cleandoc(function.__doc__ or "").split())


if __name__ == "__main__":
    # Bytes, so the ≥ of the bounds survive a terminal or pipe whose encoding is not UTF-8.
    sys.stdout.buffer.write(config_reference().encode("utf-8"))
