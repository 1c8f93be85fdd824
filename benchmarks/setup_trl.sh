#!/usr/bin/env bash
# TRL's GRPOTrainer for benchmarks/side_by_side.py, in an environment of its own
# (benchmarks/.venv-trl), so TRL and its pins never touch grpo-ray's. Idempotent.
# Usage: bash benchmarks/setup_trl.sh
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv-trl/bin/python ]; then
  "$PYTHON" -m venv .venv-trl
fi
. .venv-trl/bin/activate
pip install -q --upgrade pip
# The same CPU torch as grpo-ray's environment, so both sides run the same kernels.
pip install -q "torch==2.13.0"
pip install -q "trl==${TRL_VERSION:-1.16.0}" "transformers<5.20" datasets accelerate "peft==0.21.2"
python -c "import trl, torch, transformers; print('TRL environment ready: trl', trl.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
