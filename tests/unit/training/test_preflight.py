"""`grpo-ray validate` checks what a run needs (training/preflight.py), as `train` does first: each
failure one line naming the field or file and the fix, nothing started. The train side (no Ray
process and no MLflow run left) is tests/integration/test_train_e2e.py's bad-input test."""

import json
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from grpo_ray.cli import main

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "configs" / "tiny.yaml"


def validate(*args: str, **env: str):
    return CliRunner().invoke(main, ["validate", *map(str, args)], env=env)


def error_line(result) -> str:
    [line] = [line for line in result.output.splitlines() if line.startswith("error:")]
    return line


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project: the tiny recipe beside its own data and reward file, named relatively."""
    folder = tmp_path / "project"
    (folder / "data").mkdir(parents=True)
    rows = [{"question": f"{a}+{a}=", "answer": str(2 * a)} for a in range(10, 40)]
    (folder / "data" / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "rewards.py").write_text(
        "def score(completions, answers, **kw):\n    return [1.0 for _ in completions]\n"
    )
    recipe = TINY.read_text().replace("output_dir: ../runs/tiny", "output_dir: runs/mine")
    recipe = recipe.replace("train_files: [tiny:train]", "train_files: [data/train.jsonl]")
    recipe = recipe.replace("    - name: exact_match\n", "    - name: rewards.py:score\n")
    (folder / "recipe.yaml").write_text(recipe)
    return folder


def test_a_recipe_with_its_own_data_and_reward_validates_from_any_folder(project, monkeypatch):
    monkeypatch.chdir(project.parent)  # not the recipe's folder: its paths are relative to itself
    result = validate(project / "recipe.yaml", "--verbose")  # the resolved config only with --verbose
    assert result.exit_code == 0, result.output
    assert f"output_dir: {project}/runs/mine" in result.output
    assert "# checked: models, reward functions, 30 training and 500 evaluation prompts, the plan on this machine" in (
        result.output
    )
    assert result.output.rstrip().endswith("ok")


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "import nowhere_module\n",
            "importing '{file}' failed (ModuleNotFoundError: No module named 'nowhere_module'); fix",
        ),
        ("x = 1 / 0\n", "importing '{file}' failed (ZeroDivisionError: division by zero); fix the file"),
        (
            "def other(completions, **kw):\n    return []\n",
            "'{file}' has no attribute 'score'; check the function name",
        ),
    ],
)
def test_a_reward_file_that_does_not_load_is_one_line(project, text, expected):
    (project / "rewards.py").write_text(text)
    result = validate(project / "recipe.yaml")
    assert result.exit_code == 1
    line = error_line(result)
    assert line.startswith(f"error: reward spec '{project}/rewards.py:score'"), line
    assert expected.format(file=project / "rewards.py") in line
    assert "Traceback" not in result.output


def test_a_reward_option_the_function_does_not_take_is_named(project):
    result = validate(project / "recipe.yaml", "--set", "reward.functions=[{name: math, options: {strict: true}}]")
    assert error_line(result).startswith("error: reward 'math' has no option 'strict'; its options are:")


def test_data_whose_fields_do_not_map_names_the_fields_it_looked_for(project):
    (project / "data" / "train.jsonl").write_text(json.dumps({"q": "1+1=", "a": "2"}) + "\n")
    line = error_line(validate(project / "recipe.yaml"))
    assert line.startswith(f"error: {project}/data/train.jsonl: no usable rows (1 skipped); rows need a non-empty")
    assert "prompt field" in line and "answer field" in line


def test_missing_files_say_which_folder_relative_paths_are_read_against(project):
    (project / "data" / "train.jsonl").unlink()
    line = error_line(validate(project / "recipe.yaml"))
    assert line == (
        f"error: data.train_files: {project}/data/train.jsonl does not exist (relative paths in a recipe are relative "
        "to its folder, those given with --set to the working directory); give a jsonl/json/parquet/arrow file or a "
        "hub id"
    )


def test_a_hub_id_offline_is_one_line_at_once():
    line = error_line(validate(TINY, "--set", "model.path=someone/no-such-model", HF_HUB_OFFLINE="1"))
    assert line == (
        "error: model.path: someone/no-such-model is not in this machine's Hugging Face cache and HF_HUB_OFFLINE is "
        "set; download it first (hf download someone/no-such-model) or give a local folder"
    )
    unreachable = error_line(
        validate(TINY, "--set", "model.path=someone/no-such-model", HF_ENDPOINT="http://127.0.0.1:9")
    )
    assert unreachable.startswith(
        "error: model.path: someone/no-such-model is a hub id, but the Hugging Face hub cannot"
    )


def test_a_folder_that_holds_no_model_is_refused(tmp_path):
    line = error_line(validate(TINY, "--set", f"model.path={tmp_path}"))
    assert line.startswith(f"error: model.path: {tmp_path} holds neither config.json nor tokenizer_config.json")


def test_a_plan_larger_than_this_machine_says_what_is_missing():
    result = validate(TINY, "--set", "ray.num_cpus=1", "--set", "rollout.num_gpus=1")
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 1
    assert lines[0].startswith("error: learner and rollout and reward need 1.5 CPUs, there are 1 on this machine (1")
    assert lines[1].startswith("error: rollout needs 1 GPUs, there are 0 on this machine")
    assert all(line.endswith("or set RAY_ADDRESS") for line in lines)


def test_plan_only_checks_nothing_of_this_machine():
    result = validate(TINY, "--set", "model.path=someone/no-such-model", "--plan-only", HF_HUB_OFFLINE="1")
    assert result.exit_code == 0, result.output
    assert "plan only: models, rewards, data and resources not checked (--plan-only)" in result.output


def test_a_script_may_validate_at_its_top_level_without_a_main_guard(tmp_path):
    # The reward check spawns a sandbox child; plain spawn would run this script again in it.
    import subprocess
    import sys

    script = tmp_path / "check.py"
    script.write_text(f"import grpo_ray\nprint('prompts', grpo_ray.validate({str(TINY)!r}).train_prompts)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "prompts 7600"


@pytest.mark.vllm
def test_a_vllm_engine_option_this_vllm_does_not_have_or_refuses_is_named_before_anything_starts():
    vllm = pytest.importorskip("vllm", exc_type=ImportError)
    result = validate(TINY, "--set", "rollout.backend=vllm", "--set", "rollout.vllm.engine_args.max_num_seq=8")
    assert result.exit_code == 1
    assert error_line(result).startswith(
        "error: rollout.vllm.engine_args: max_num_seq is not an engine option of vLLM "
    ), result.output
    # A value vLLM refuses as it reads it (a misspelt key of one of its typed options), as one line too.
    typo = "rollout.vllm.engine_args.compilation_config={cudagraph_capture_sizez: [1, 2]}"
    result = validate(TINY, "--set", "rollout.backend=vllm", "--set", typo)
    assert result.exit_code == 1
    assert error_line(result) == (
        "error: rollout.vllm.engine_args.compilation_config: cudagraph_capture_sizez: Unexpected keyword argument "
        f"(vLLM {vllm.__version__}); fix or remove it"
    ), result.output


def test_every_problem_is_named_at_once_model_data_and_resources():
    result = validate(
        TINY, "--set", "learner.num_gpus=1", "--set", "model.path=./nomodel", "--set", "data.train_files=[nofile.jsonl]"
    )
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 1 and len(lines) == 3, result.output
    assert lines[0].startswith("error: model.path: ") and "nomodel does not exist" in lines[0]
    assert lines[1].startswith("error: data.train_files: ") and "nofile.jsonl does not exist" in lines[1]
    assert lines[2].startswith("error: learner needs 1 GPUs, there are 0 on this machine")


def test_a_hub_dataset_that_cannot_be_reached_is_one_line_naming_the_field():
    offline = error_line(validate(TINY, "--set", "data.train_files=[someone/no-such-data]", HF_HUB_OFFLINE="1"))
    assert offline == (
        "error: data.train_files: someone/no-such-data is not in this machine's Hugging Face cache and HF_HUB_OFFLINE "
        "is set; download it first (hf download --repo-type dataset someone/no-such-data) or give a local "
        "jsonl/json/parquet/arrow file"
    )
    started = time.monotonic()
    unreachable = error_line(
        validate(TINY, "--set", "data.eval_files=[someone/no-such-data]", HF_ENDPOINT="http://127.0.0.1:9")
    )
    assert unreachable.startswith("error: data.eval_files: someone/no-such-data is a hub id, but the Hugging Face hub")
    assert time.monotonic() - started < 30  # `datasets` alone retried for 51 s, five lines of it


def test_a_passing_plan_prints_no_line_that_reads_as_an_error_and_names_the_environment_it_checked():
    result = validate(REPO / "configs" / "tiny-tools.yaml")
    assert result.exit_code == 0, result.output
    assert not [line for line in result.output.splitlines() if re.search(r"\b(error|unknown|cannot|failed)\b", line)]
    assert "# resolved config" not in result.output and len(result.output.splitlines()) < 60
    assert "# checked: models, reward functions, the environment " in result.output


# train's preflight in two parts (checks_beside_ray): the quick checks before any Ray starts, the
# slow ones (reward functions and environment imported, prompts tokenised) while its Ray starts.


def test_train_gets_the_slow_checks_to_run_beside_ray_and_they_give_what_preflight_gives(project):
    from grpo_ray.config import load_config
    from grpo_ray.training.preflight import checks_beside_ray, preflight

    cfg = load_config(project / "recipe.yaml")
    slow_checks = checks_beside_ray(cfg)
    inputs, checked = slow_checks(), preflight(cfg, connect=False).inputs
    assert (inputs.train_prompts, inputs.eval_prompts) == (checked.train_prompts, checked.eval_prompts)
    assert len(inputs.train_prompts) == 30


def test_a_bad_input_among_the_quick_checks_is_raised_at_once_with_what_the_slow_ones_find(project):
    from grpo_ray.config import load_config
    from grpo_ray.training.preflight import PreflightError, checks_beside_ray

    (project / "rewards.py").write_text("x = 1 / 0\n")
    cfg = load_config(project / "recipe.yaml", ["model.path=/no/such/model"])
    with pytest.raises(PreflightError) as raised:
        checks_beside_ray(cfg)
    assert raised.value.lines[0].startswith("model.path: /no/such/model does not exist")
    assert "ZeroDivisionError" in raised.value.lines[1]


def test_a_bad_input_only_the_slow_checks_find_is_raised_when_they_run(project):
    from grpo_ray.config import load_config
    from grpo_ray.rewards import RewardSpecError
    from grpo_ray.training.preflight import checks_beside_ray

    (project / "rewards.py").write_text("x = 1 / 0\n")
    slow_checks = checks_beside_ray(load_config(project / "recipe.yaml"))
    with pytest.raises(RewardSpecError, match="ZeroDivisionError"):
        slow_checks()


def test_each_data_file_is_looked_for_once_so_a_hub_dataset_is_asked_for_once(project, monkeypatch):
    # A hub dataset not cached here costs a request to the hub each time its path is checked.
    import grpo_ray.training.inputs as inputs
    from grpo_ray.config import load_config
    from grpo_ray.training.preflight import checks_beside_ray, preflight

    looked_for = []
    real_check = inputs.check_data_path
    monkeypatch.setattr(
        inputs, "check_data_path", lambda spec, field: looked_for.append(spec) or real_check(spec, field)
    )
    cfg = load_config(project / "recipe.yaml")
    checks_beside_ray(cfg)()
    assert looked_for == [str(project / "data" / "train.jsonl"), "tiny:heldout"]
    looked_for.clear()
    preflight(cfg, connect=False)
    assert looked_for == [str(project / "data" / "train.jsonl"), "tiny:heldout"]
    # A file that is not there is named once, and its rows are not read: one problem, raised as itself
    # (two would be a PreflightError).
    (project / "data" / "train.jsonl").unlink()
    with pytest.raises(inputs.DataError, match="data.train_files: .*train.jsonl does not exist"):
        preflight(cfg, connect=False)


def test_validate_shows_the_first_training_prompt_as_the_model_sees_it(project):
    """With the chat template its markers are shown; as plain text the prompt is the text alone (the
    tiny tokenizer adds no BOS; one that does shows it: tests/integration/test_gemma3.py)."""
    first = "10+10="  # the project's first row
    templated = validate(project / "recipe.yaml")
    assert templated.exit_code == 0, templated.output
    shown = templated.output.split("# the first training prompt as the model sees it (", 1)[1]
    assert shown.startswith("14 tokens, special tokens shown)\n| <|im_start|>user\n| 10+10=<|im_end|>\n"), shown
    plain = validate(project / "recipe.yaml", "--set", "data.apply_chat_template=false")
    assert plain.exit_code == 0, plain.output
    assert f"it (6 tokens, special tokens shown)\n| {first}\n\n# checked:" in plain.output
    import grpo_ray

    assert grpo_ray.validate(project / "recipe.yaml").first_prompt.startswith("<|im_start|>user\n10+10=")
