"""`grpo-ray validate` with teachers (distillation.teachers): each one a role of the plan and a row of
the memory plan, its model checked like the policy's, and a teacher that cannot run one line."""

from pathlib import Path

from click.testing import CliRunner

from grpo_ray.cli import main

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "configs" / "tiny.yaml"
# A teacher for the tiny recipe's rows (they name no data source: the one teacher teaches them all).
TEACHER = "distillation.teachers=[{name: big, model_path: tiny, num_cpus: 0.25}]"


def validate(*args: str):
    return CliRunner().invoke(main, ["validate", *map(str, args)])


def test_a_recipe_with_a_teacher_validates_with_its_role_and_memory_row():
    result = validate(TINY, "--set", TEACHER, "--set", "distillation.coef=0.5")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "teacher-big x1  0.25 CPU each (0.25 CPU in all)" in lines
    # On this machine's CPU: its row in the host-memory plan, its process and its 0.5 M float32 parameters.
    assert any(line.startswith("teacher-big  x1  process 0.48 GiB  model 0.00 GiB") for line in lines), lines
    assert result.output.rstrip().endswith("ok")


def test_a_teacher_that_does_not_exist_is_one_line_naming_its_field(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = "distillation.teachers=[{name: big, model_path: ./no-teacher}]"
    result = validate(TINY, "--set", missing)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 1 and errors == [
        f"error: distillation.teachers.0.model_path: {tmp_path}/no-teacher does not exist (relative paths in a recipe "
        "are relative to its folder, those given with --set to the working directory); give a model folder, a hub "
        "id (org/name) or 'tiny'"
    ], result.output


def test_a_teacher_that_the_machine_cannot_hold_is_named_in_the_plan():
    result = validate(TINY, "--set", "distillation.teachers=[{name: big, model_path: tiny, num_gpus: 1}]")
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 1 and len(errors) == 1, result.output
    assert errors[0].startswith("error: teacher-big needs 1 GPUs, there are 0 on this machine")


def test_the_teachers_signal_alone_validates_without_reward_functions():
    result = validate(
        TINY, "--set", TEACHER, "--set", "distillation.with_rewards=false", "--set", "reward.functions=[]"
    )
    assert result.exit_code == 0, result.output
    assert "distillation                   big (tiny: every row); coef 1, the teachers' signal alone" in result.output
