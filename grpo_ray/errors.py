"""The one line of an error a user reads: every "error: ..." the platform prints is one line, and
the exceptions it turns into messages (a library's, a user function's) may have many."""

from __future__ import annotations

import re

# The line a Python traceback's exception starts at: its qualified name, then its message
# ("ValueError: ...", "pydantic_core._pydantic_core.ValidationError: 1 validation error ...").
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Fault)\b(:.*)?$")


def first_line(error: BaseException | str, with_type: bool = False, limit: int = 0) -> str:
    """The first non-empty line of `error`'s message, or its type's name when it has none.
    with_type: "TypeName: line" (for an error whose type says what happened, e.g. a user function's
    ZeroDivisionError). limit: at most this many characters (0: no limit), cut with "..."."""
    text = error if isinstance(error, str) else str(error)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    name = "" if isinstance(error, str) else type(error).__name__
    line = lines[0] if lines else name
    if with_type and lines and name:
        line = f"{name}: {line}"
    if limit and len(line) > limit:
        line = line[: limit - 3] + "..."
    return line


# The rule config/paths.py applies, said in every error about a path that does not exist.
RELATIVE_PATHS = (
    "relative paths in a recipe are relative to its folder, those given with --set to the working directory"
)


def missing_path_hint(field: str = "") -> str:
    """The tail of a "does not exist" error: which folder a relative path was read against (a
    command's own option, "--data", is read against the working directory alone)."""
    return "(relative to the working directory)" if field.startswith("--") else f"({RELATIVE_PATHS})"


class ModelLoadError(ValueError):
    """A model or tokenizer that cannot be loaded; one-line message naming the path."""


class ClusterError(RuntimeError):
    """The cluster cannot run the plan, cannot be reached, or an actor failed; one-line message.
    Here rather than in cluster/, so that what raises or catches it need not import Ray."""
