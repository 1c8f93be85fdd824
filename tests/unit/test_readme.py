"""The README a newcomer reads: at most 400 lines, every command it shows is run by a test (this
file's COMMANDS names which), its links lead somewhere, and it holds no development log, no plan
for the next GPU lease and no path outside the repository."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

# Every command of the README's ```bash blocks -> the test that runs it (file, function).
RUNS = "tests/integration/test_readme_commands.py"
COMMANDS = {
    ".venv/bin/grpo-ray train configs/tiny.yaml --set train.steps=200": (RUNS, "test_the_first_run"),
    "bash scripts/setup.sh && .venv/bin/grpo-ray train configs/tiny.yaml --set train.steps=200": (
        RUNS,
        "test_the_first_run",  # the set-up half is .ci/run's first command, on every CI run
    ),
    "bash scripts/setup.sh && bash scripts/test.sh": (
        "tests/unit/test_readme.py",
        "test_ci_runs_the_readme_test_command",
    ),
    "bash scripts/setup_gpu.sh": (
        "tests/unit/test_gpu_lock.py",
        "test_setup_gpu_stops_before_installing_anything_where_nvidia_smi_finds_no_gpu",
    ),
    ".venv/bin/grpo-ray validate configs/tiny.yaml": (RUNS, "test_validate_and_eval"),
    ".venv/bin/grpo-ray validate examples/my-task/recipe.yaml": (RUNS, "test_your_own_data_and_reward"),
    ".venv/bin/grpo-ray train examples/my-task/recipe.yaml": (RUNS, "test_your_own_data_and_reward"),
    ".venv/bin/python examples/train_from_python.py": (RUNS, "test_the_python_example"),
    ".venv/bin/grpo-ray train configs/tiny-tools.yaml": (RUNS, "test_the_agent_recipe_learns_to_call_its_tool"),
    ".venv/bin/grpo-ray train configs/smollm2-arithmetic.yaml": (RUNS, "test_the_real_model_recipe_learns"),
    ".venv/bin/grpo-ray train configs/gemma3-arithmetic.yaml": (RUNS, "test_the_gemma_recipe_learns"),
    ".venv/bin/grpo-ray train configs/tiny-distill.yaml": (
        RUNS,
        "test_the_distillation_recipe_learns_from_its_teacher",
    ),
    # HEAD, /opt/grpo-ray and /shared are the reader's: the test runs it on a two-node `ray start`
    # cluster with its own addresses, the checkout's .venv and a temporary output_dir.
    "ray job submit --address http://HEAD:8265 --working-dir . -- /opt/grpo-ray/.venv/bin/grpo-ray train "
    "configs/tiny.yaml --set output_dir=/shared/runs/tiny": (
        "tests/integration/test_cluster_ops.py",
        "test_the_readmes_job_submit_runs_from_an_uploaded_working_dir",
    ),
    ".venv/bin/grpo-ray train configs/tiny.yaml --set train.steps=200 --set output_dir=runs/lr-2e-4 "
    "--set learner.lr=2e-4": (RUNS, "test_comparing_two_runs"),
    ".venv/bin/grpo-ray runs compare runs/tiny runs/lr-2e-4": (RUNS, "test_comparing_two_runs"),
    ".venv/bin/grpo-ray eval --model tiny --data tiny:heldout --temperature 0 --max-tokens 4 --reward exact_match": (
        RUNS,
        "test_validate_and_eval",
    ),
}


def readme_commands(text: str) -> list[str]:
    """The commands of the ```bash blocks, one per line (comments and blank lines left out)."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    return [
        line.strip() for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("#")
    ]


def test_every_command_the_readme_shows_is_run_by_a_named_test():
    shown = readme_commands(README.read_text())
    assert set(shown) == set(COMMANDS), f"commands without a test: {set(shown) - set(COMMANDS)}"
    for command, (path, name) in COMMANDS.items():
        assert f"def {name}(" in (REPO / path).read_text(), f"{path} has no {name} (runs {command!r})"


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == "bash scripts/setup.sh && bash scripts/test.sh"
    assert "bash scripts/setup.sh && bash scripts/test.sh" in readme_commands(README.read_text())


def test_a_newcomer_reads_it_in_ten_minutes():
    text = README.read_text()
    assert len(text.splitlines()) <= 400
    for stale in ("Next lease", "next lease", "TODO", "../shared", "/work/shared"):
        assert stale not in text, stale
    assert not re.search(r"\(\.\./", text), "a link outside the repository"


def test_every_link_leads_to_a_file_of_the_repository():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text()):
        if not target.startswith("http"):
            assert (REPO / target).exists(), target
