"""docs/from-trl-and-verl.md cannot rot: every recipe field its tables name in the grpo-ray column
is a field of the schema, and every value it shows there (`field: value`) is one a recipe accepts."""

import re
import types
import typing
from pathlib import Path

import yaml
from pydantic import BaseModel

from grpo_ray.config import Config, ConfigError, config_from_dict

PAGE = Path(__file__).resolve().parents[2] / "docs" / "from-trl-and-verl.md"
GRPO_RAY_COLUMN = 2  # | TRL | verl | grpo-ray | where it differs |


def named_rows(text: str) -> list[list[tuple[str, str | None]]]:
    """Per table row, (dotted field, value or None) of each `field` or `field: value` of its grpo-ray cell."""
    found = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 4 or cells[GRPO_RAY_COLUMN] in ("grpo-ray", "---"):
            continue
        items = re.findall(r"`([^`]+)`", cells[GRPO_RAY_COLUMN])
        found.append([(name, value or None) for name, _, value in (item.partition(": ") for item in items)])
    return found


def named_fields(text: str) -> list[tuple[str, str | None]]:
    return [item for row in named_rows(text) for item in row]


def resolves(dotted: str) -> bool:
    """The dotted path (`reward.functions[].name`) names a field of Config."""
    model: type[BaseModel] | None = Config
    for part in dotted.split("."):
        name = part.removesuffix("[]")
        if model is None or name not in model.model_fields:
            return False
        model = _section_of(model.model_fields[name].annotation)
    return True


def _section_of(annotation) -> type[BaseModel] | None:
    """The section model a field holds (itself, or the items of a tuple or an optional)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) in (tuple, typing.Union):
        return next((m for m in map(_section_of, typing.get_args(annotation)) if m is not None), None)
    return None


def as_recipe(items: list[tuple[str, str]]) -> dict:
    """The recipe that sets each dotted field to its value (YAML)."""
    recipe: dict = {}
    for dotted, value in items:
        *sections, name = dotted.split(".")
        inner = recipe
        for section in sections:
            inner = inner.setdefault(section, {})
        inner[name] = yaml.safe_load(value)
    return recipe


def test_every_grpo_ray_field_of_the_page_is_in_the_schema():
    fields = named_fields(PAGE.read_text())
    # The fields the issue asked for are all there (so the parser above reads the tables).
    for asked in ("rollout.samples_per_prompt", "algorithm.kl_coef", "algorithm.clip_high", "train.prompts_per_step"):
        assert asked in {name for name, _ in fields}, asked
    unknown = [name for name, _ in fields if not resolves(name)]
    assert not unknown, f"docs/from-trl-and-verl.md names fields the schema lacks: {unknown}"


def test_every_value_the_page_shows_is_accepted_by_a_recipe():
    # The values of one row go together (a sleep level with the vllm backend it needs).
    refused = []
    for row in named_rows(PAGE.read_text()):
        values = [(name, value) for name, value in row if value is not None]
        try:
            config_from_dict(as_recipe(values))
        except ConfigError as err:
            refused.append(f"{values} ({err})")
    assert not refused, refused


def test_the_checks_catch_a_field_that_is_not_there():
    assert resolves("reward.functions[].weight") and resolves("rollout.vllm.gpu_memory_utilization")
    assert not resolves("rollout.num_generations") and not resolves("algorithm.beta")
    assert named_fields("| `beta` | | `algorithm.kl_coef: 0.1` | |") == [("algorithm.kl_coef", "0.1")]
