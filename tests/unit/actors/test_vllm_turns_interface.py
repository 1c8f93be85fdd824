"""VllmTurns and the request loop it shares (vllm_requests.Requests) reach the vllm engine through its
public interface only, read from the source (no vLLM needed): an underscore member of the engine
used from another module breaks silently the day the engine renames it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ACTORS = Path(__file__).resolve().parents[3] / "grpo_ray" / "actors"
USERS = ["vllm_turns.py", "vllm_requests.py"]


def private_reads(source: str) -> list[str]:
    """`x._name` read from anything but `self` itself (e.g. `self.engine._loop`, `engine._request`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def engine_reads(source: str) -> set[str]:
    """The names read from `engine` or `self.engine`."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "engine") or (
                isinstance(owner, ast.Attribute) and owner.attr == "engine"
            ):
                names.add(node.attr)
    return names


def engine_members() -> set[str]:
    """What VllmEngine defines: its methods and properties, and the attributes its methods set on self."""
    tree = ast.parse((ACTORS / "vllm_engine.py").read_text())
    [engine] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "VllmEngine"]
    members = {n.name for n in engine.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(engine):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            if isinstance(node.ctx, ast.Store):
                members.add(node.attr)
    return members


def test_the_rule_sees_a_private_member_of_the_engine():
    source = "def f(self, engine):\n    self._ok = engine._loop\n    return self.engine._request(1)\n"
    assert private_reads(source) == ["line 2: engine._loop", "line 3: self.engine._request"]
    assert engine_reads(source) == {"_loop", "_request"}


@pytest.mark.parametrize("module", USERS)
def test_the_engines_users_read_no_private_member_of_it(module):
    assert private_reads((ACTORS / module).read_text()) == [], f"actors/{module} reaches into VllmEngine"


@pytest.mark.parametrize("module", USERS)
def test_what_they_ask_of_the_engine_it_has(module):
    missing = engine_reads((ACTORS / module).read_text()) - engine_members()
    assert missing == set(), f"actors/{module} asks VllmEngine for {sorted(missing)}, which it lacks"
