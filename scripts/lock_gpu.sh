#!/usr/bin/env bash
# Regenerates requirements/gpu.lock, the exact versions scripts/setup_gpu.sh installs on a Linux x86_64
# machine with an NVIDIA GPU, on any machine (this one has no GPU): uv resolves for the GPU machine's
# Python and platform from the packages' metadata alone, so none of the multi-GB CUDA wheels is
# downloaded (~110 MB of index pages and wheel headers, and DeepSpeed's sdist, built for its metadata).
# pip cannot do this: its --platform needs --only-binary=:all:, and DeepSpeed publishes no wheel.
#   bash scripts/lock_gpu.sh                             # the newest versions inside pyproject's ranges and gpu.in's pins
#   CONSTRAINTS=tested.txt bash scripts/lock_gpu.sh      # ... kept at an environment's versions (pip freeze on the GPU)
# The lock in the repository: CONSTRAINTS=../shared/gpu/overlay-requirements.txt (the overlay that ran on the H100).
# Then run tests/unit/test_gpu_lock.py (it re-resolves with the lock's "Resolved by" line) before
# committing, and scripts/setup_gpu.sh with the gpu tests on a GPU machine.
set -euo pipefail
[ -n "${CONSTRAINTS:-}" ] && CONSTRAINTS=$(realpath "$CONSTRAINTS")
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9
# The GPU machine's Python (its minor version is the one setup_gpu.sh accepts) and platform: glibc 2.28+.
RESOLVE=(--python-version 3.12 --python-platform x86_64-manylinux_2_28
         --extra test --extra liger --extra quant pyproject.toml requirements/gpu.in)
TOOLS=${TOOLS:-/tmp/grpo-ray-uv}
if ! "$TOOLS/bin/uv" --version 2>/dev/null | grep -q "^uv $UV_VERSION\b"; then
  rm -rf "$TOOLS" && python3 -m venv "$TOOLS" && "$TOOLS/bin/pip" install -q "uv==$UV_VERSION"
fi
args=(--quiet --no-header "${RESOLVE[@]}")
[ -n "${CONSTRAINTS:-}" ] && args+=(-c "$CONSTRAINTS")
# UV_PYTHON_DOWNLOADS=never: DeepSpeed's metadata is built with a Python found here, whichever minor.
UV_PYTHON_DOWNLOADS=never "$TOOLS/bin/uv" pip compile "${args[@]}" -o requirements/gpu.lock.new \
  || { rm -f requirements/gpu.lock.new; echo "error: uv could not resolve pyproject.toml with requirements/gpu.in for the GPU machine (its message above); change requirements/gpu.in"; exit 1; }
{
  echo "# Exact versions for a Linux x86_64 machine with an NVIDIA GPU whose driver runs CUDA 13.0 (580 or newer):"
  echo "# what scripts/setup_gpu.sh installs, for Python 3.12 on manylinux_2_28 (glibc 2.28+). torch and vLLM are"
  echo "# PyPI's CUDA 13.0 builds. Made on a machine without a GPU by scripts/lock_gpu.sh from pyproject.toml (extras"
  echo "# test, liger, quant) and requirements/gpu.in, resolved by uv from the packages' metadata (no CUDA wheel"
  echo "# downloaded); installed with pip install --no-deps -r, then grpo-ray with --no-deps -e . The line below is"
  echo "# the resolution tests/unit/test_gpu_lock.py repeats, with this file as constraints, to check it."
  echo "# Resolved by: uv $UV_VERSION pip compile ${RESOLVE[*]}"
  [ -n "${CONSTRAINTS:-}" ] && echo "# Kept at the versions of $(basename "$CONSTRAINTS") (CONSTRAINTS) where they fit."
  echo
  sed 's|^    #   -c .*|    #   -c (constraints)|; s|^    # via -c .*|    # via -c (constraints)|' requirements/gpu.lock.new
} > requirements/gpu.lock
rm requirements/gpu.lock.new
echo "requirements/gpu.lock: $(grep -c '^[A-Za-z].*==' requirements/gpu.lock) pins"
