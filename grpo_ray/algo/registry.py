"""The one lookup every algorithm registry uses: a variant's name (or enum member) to its function."""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

F = TypeVar("F")


def lookup(registry: dict, kind: type[Enum], name: Enum | str, what: str) -> F:
    """registry[kind(name)]; an unknown name raises ValueError listing the valid choices."""
    try:
        return registry[kind(name)]
    except ValueError:
        choices = [member.value for member in kind]
        raise ValueError(f"unknown {what} {name!r}; choose one of {choices}") from None
