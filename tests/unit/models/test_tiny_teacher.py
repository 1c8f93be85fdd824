"""The built-in tiny teacher (models/tiny_teacher.py): found by its name wherever a model path is
taken, built from its shipped weights only if they are the file shipped, over the tiny model's very
tokenizer, and clearly better than the tiny model on held-out prompts."""

from pathlib import Path

import pytest

from grpo_ray.config.loading import load_config
from grpo_ray.models import tiny
from grpo_ray.models.loading import load_tokenizer, resolve_model_path
from grpo_ray.models.reference_vocab import check_reference_tokenizer, vocabulary_difference
from grpo_ray.models.tiny_task import read_jsonl
from grpo_ray.models.tiny_teacher import REBUILD, SHIPPED, SHIPPED_SHA256, ensure_tiny_teacher
from grpo_ray.models.tiny_weights import load_shipped_weights

TINY_RECIPE = Path(__file__).resolve().parents[3] / "configs" / "tiny.yaml"


def test_the_name_resolves_to_a_built_model_folder_and_recipes_keep_it():
    folder = Path(resolve_model_path("tiny-teacher"))
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert folder != Path(resolve_model_path("tiny"))
    # A built-in name, not a path relative to the recipe's folder, in every model field.
    cfg = load_config(
        TINY_RECIPE, ["model.path=tiny-teacher", "reference.model_path=tiny-teacher", "algorithm.kl_coef=0.01"]
    )
    assert (cfg.model.path, cfg.reference.model_path) == ("tiny-teacher", "tiny-teacher")


def test_it_shares_the_tiny_models_tokenizer_exactly():
    student, teacher = load_tokenizer("tiny"), load_tokenizer("tiny-teacher")
    assert vocabulary_difference(student.get_vocab(), teacher.get_vocab()) is None
    assert (teacher.eos_token_id, teacher.pad_token_id) == (student.eos_token_id, student.pad_token_id)
    assert teacher.chat_template == student.chat_template
    # As a reference (and so a teacher) of the tiny model, it passes the vocabulary check.
    check_reference_tokenizer(student, "tiny-teacher", None)


def test_the_shipped_weights_build_and_a_changed_file_is_refused_in_one_line(tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_teacher(tmp_path))
    changed = tmp_path / SHIPPED.name
    data = bytearray(SHIPPED.read_bytes())
    data[-1] ^= 1
    changed.write_bytes(bytes(data))
    with pytest.raises(
        RuntimeError, match=f"tiny_teacher_v1.safetensors: sha256 .* expected {SHIPPED_SHA256[:12]}"
    ) as err:
        load_shipped_weights(model, changed, SHIPPED_SHA256, REBUILD)
    assert "\n" not in str(err.value) and "scripts/make_tiny_teacher.sh" in str(err.value)


def test_it_answers_held_out_prompts_far_better_than_the_tiny_model():
    from transformers import AutoModelForCausalLM

    # The first 64 of the 500 held-out prompts, greedy, as the recipes evaluate: measured 6/64 = 0.094
    # for the tiny model and 53/64 = 0.828 for the teacher (0.210 and 0.838 on all 500).
    rows = read_jsonl(tiny.ensure_tiny_artifacts().heldout_file)[:64]
    accuracy = {}
    for name in ("tiny", "tiny-teacher"):
        model = AutoModelForCausalLM.from_pretrained(resolve_model_path(name))
        accuracy[name] = tiny.greedy_accuracy(model, load_tokenizer(name), rows)
    assert accuracy["tiny-teacher"] > 0.7 and accuracy["tiny-teacher"] - accuracy["tiny"] > 0.5, accuracy
