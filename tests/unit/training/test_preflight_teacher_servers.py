"""`grpo-ray validate` with teachers scored by vLLM (a url teacher's server, or backend: vllm): a url
teacher validates with no server up (its tokenizer is checked here, its model takes no memory), and
a stage sampling at a temperature other than 1, which vLLM's prompt log-probs do not take, is one line."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from grpo_ray.cli import main

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "configs" / "tiny.yaml"
QWEN2_TOKENIZER = Path("/work/shared/tokenizers/qwen2")
# Nothing listens there: validate never asks the server.
SERVED = "distillation.teachers=[{name: far, url: 'http://127.0.0.1:9/v1', model: tiny, tokenizer: tiny}]"


def validate(*args: str):
    return CliRunner().invoke(main, ["validate", *map(str, args)])


def errors(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("error:")]


def test_a_url_teacher_validates_without_its_server_and_takes_no_memory_here():
    result = validate(TINY, "--set", SERVED)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "teacher-far x1  0.5 CPU each (0.5 CPU in all)" in lines
    assert "teacher-far  served at http://127.0.0.1:9/v1 (tiny): no memory here" in lines


@pytest.mark.skipif(not QWEN2_TOKENIZER.is_dir(), reason="the shared Qwen2 tokenizer is not on this machine")
def test_a_url_teacher_whose_tokenizer_is_another_familys_is_one_line():
    teacher = f"distillation.teachers=[{{name: far, url: 'http://127.0.0.1:9/v1', tokenizer: {QWEN2_TOKENIZER}}}]"
    found = errors(validate(TINY, "--set", teacher))
    assert len(found) == 1 and found[0].startswith(
        f"error: distillation.teachers.0.tokenizer (teacher far): the tokenizer of {QWEN2_TOKENIZER} maps the tokens "
        "of the student tiny to other ids"
    ), found


@pytest.mark.parametrize(
    "teacher, temperature, field",
    [
        (SERVED, "rollout.temperature=0.7", "rollout.temperature: 0.7"),
        (
            "distillation.teachers=[{name: far, model_path: tiny, backend: vllm}]",
            "stages=[{name: a, steps: 2}, {name: b, steps: 2, temperature: 1.2}]",
            "stages.1.temperature: 1.2",
        ),
    ],
)
def test_a_teacher_scored_by_vllm_refuses_a_temperature_other_than_1(teacher, temperature, field, tmp_path):
    # tiny.yaml without train.steps (stages set their own); its paths are built-in data, not files.
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("\n".join(line for line in TINY.read_text().splitlines() if not line.startswith("  steps:")))
    found = errors(validate(recipe, "--set", teacher, "--set", temperature))
    assert found == [
        f"error: {field}, and teacher far (distillation.teachers.0) is scored by vLLM, whose prompt log-probs are the "
        "model's at temperature 1 (it applies no temperature to them); sample at temperature 1, or run the teacher "
        "with model_path and backend: hf"
    ]
    # The hf teacher takes the stage's temperature.
    hf = "distillation.teachers=[{name: far, model_path: tiny}]"
    assert validate(recipe, "--set", hf, "--set", temperature).exit_code == 0
