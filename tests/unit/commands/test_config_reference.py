"""The configuration reference: docs/configuration.md is current, every key of `Config` is in it, its entries
say what the schema says, and its descriptions are the comments of the source (an edited comment shows)."""

from __future__ import annotations

import inspect
import types
import typing
from pathlib import Path

from pydantic import BaseModel

from grpo_ray.config import schema
from grpo_ray.commands.config_reference import COMMAND, config_reference, field_comments
from grpo_ray.config.schema import Config
from grpo_ray.data.formats import GENERIC_ANSWER_FIELDS, GENERIC_PROMPT_FIELDS

DOCS = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_docs_configuration_md_is_what_the_schema_generates():
    written = DOCS.read_text(encoding="utf-8") if DOCS.is_file() else ""
    assert written == config_reference(), f"docs/configuration.md is out of date; regenerate it: {COMMAND}"


def config_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of the model, walked through its fields: a section's own keys below it, a list's
    entries under `key[]`, a mapping's values under `key.<key>`."""
    keys = []
    for name, field in model.model_fields.items():
        key = f"{prefix}.{name}" if prefix else name
        keys.append(key)
        for sub_key, sub_model in sections_in(field.annotation, key):
            keys += config_keys(sub_model, sub_key)
    return keys


def sections_in(annotation, key: str) -> list[tuple[str, type[BaseModel]]]:
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is None and inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [(key, annotation)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tuple and args[-1:] == (Ellipsis,):
        return sections_in(args[0], key + "[]")
    if origin is dict:
        return sections_in(args[1], key + ".<key>")
    return (
        [found for arg in args for found in sections_in(arg, key)] if origin in (typing.Union, types.UnionType) else []
    )


def test_every_key_of_config_has_a_row():
    keys = config_keys(Config)
    reference = config_reference()
    # A walk that found nothing would pass vacuously: the schema has some 200 keys, 3 nested levels deep.
    assert len(keys) > 150 and "reward.by_source.<key>[].weight" in keys and "rollout.vllm.sleep_level" in keys
    missing = [key for key in keys if f"\n| `{key}` | " not in reference]
    assert missing == [], f"keys of Config with no row in the reference: {missing}"


def test_entries_checked_by_hand():
    reference = config_reference().splitlines()
    # schema.py: `# Optimizer steps to run.` above `steps: int = Field(100, ge=1)` in TrainConfig.
    assert "| `train.steps` | `int` | `100` | ≥ 1 | Optimizer steps to run. |" in reference
    # role_sections.py: a Literal, its values quoted; the table's `|` escaped inside the code span.
    assert (
        '| `rollout.backend` | `"hf" \\| "vllm"` | `hf` |  | '
        'Generation engine: "hf" (transformers generate with KV cache) or "vllm". |'
    ) in reference
    # schema.py: two comment lines joined by a space; null default, both bounds.
    assert (
        "| `train.stop_at_accuracy` | `float \\| None` | `null` | > 0, ≤ 1 | End the run at the first evaluation "
        "whose held-out accuracy reaches this (its model and a final checkpoint are saved as at the last step); "
        "null: run every step. |"
    ) in reference
    # A required key of a list's entries, with its length and pattern constraints.
    assert (
        "| `stages[].name` | `str` | required | length ≥ 1, pattern `^[A-Za-z0-9_.-]+$` | Name of the stage: "
        "its MLflow run (nested under the training run) and its output folder. |"
    ) in reference


def test_an_inherited_field_takes_its_comment_from_the_base_class():
    # `resources` is declared once, on _RoleSection in base.py, and documented under every role.
    rows = [line for line in config_reference().splitlines() if line.startswith("| `learner.resources` |")]
    assert len(rows) == 1 and "Node targeting: custom Ray resources each worker" in rows[0]
    assert "values: > 0" in rows[0]


def test_text_that_markdown_would_eat_is_escaped():
    reference = config_reference()
    assert "a sqlite store at \\<output_dir>/mlflow.db." in reference  # not an HTML tag
    assert "(mean \\|log-prob difference\\| on the probe)" in reference  # not a cell border
    assert "the first scale is 2 \\*\\* initial_scale_power." in reference  # not emphasis


def test_an_edited_comment_in_a_copy_of_the_schema_shows_in_the_reference():
    source = inspect.getsource(schema)
    assert source.count("    # Optimizer steps to run.\n") == 1
    edited = source.replace("    # Optimizer steps to run.\n", "    # Edited: the steps.\n    # A second line.\n")
    reference = config_reference({schema.__name__: edited})
    assert "| `train.steps` | `int` | `100` | ≥ 1 | Edited: the steps. A second line. |" in reference
    assert "Optimizer steps to run." not in reference


HAND_WRITTEN = """
class Outer(Base):
    # Two lines of comment
    # joined into one.
    first: int = 1
    second: str = "# not a comment"  # a comment after the field is not its description

    # A comment with a blank line after it belongs to no field.

    third: float = Field(1.0, gt=0)
    #No space after the hash.
    fourth: tuple[int, ...] = ()
    not_a_field = 5
    # Above a method, not a field.
    def method(self) -> None:
        # Inside the method.
        local: int = 0

    class Inner(Base):
        # The inner class's field.
        deep: bool = False
"""


def test_field_comments_reads_the_block_directly_above_each_annotated_field():
    assert field_comments(HAND_WRITTEN) == {
        "Outer": {
            "first": "Two lines of comment joined into one.",
            "second": "",
            "third": "",
            "fourth": "No space after the hash.",
        },
        "Inner": {"deep": "The inner class's field."},
    }


def test_data_fields_come_from_the_loaders_constants():
    data = config_reference().split("## Data fields", 1)[1]
    for name in GENERIC_PROMPT_FIELDS + GENERIC_ANSWER_FIELDS:
        assert f"`{name}`" in data
    for fmt in ("polaris", "gsm8k", "verl", "generic"):
        assert f"| `{fmt}` | " in data
    assert "`reward.source_field` (default `data_source`)" in data


def test_the_reference_says_it_is_generated_and_by_what():
    assert COMMAND in config_reference().splitlines()[2]
