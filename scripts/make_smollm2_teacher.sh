#!/usr/bin/env bash
# Makes the teacher of configs/smollm2-distill.yaml: SmolLM2-135M-Instruct (the built-in
# smollm2-135m) after 40 GRPO steps of configs/smollm2-arithmetic.yaml, its final weights in
# runs/smollm2-teacher/model (538 MB; too large to ship). Prints its held-out accuracy (0.08 at the
# start; greedy, the 200 held-out sums). About 10 minutes on 2 cores, start-up included. The run
# is not bit-for-bit the same on another kind of CPU (real models' kernels differ), so the
# teacher's accuracy is measured, not assumed: benchmarks/distill_race.py --real reports it.
# Usage: bash scripts/make_smollm2_teacher.sh [OUTPUT_DIR] (runs/smollm2-teacher)
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(realpath -m "${1:-runs/smollm2-teacher}")"
.venv/bin/grpo-ray train configs/smollm2-arithmetic.yaml --no-resume --set output_dir="$out" \
  --set train.steps=40 --set train.eval_every=10 --set train.checkpoint_every=40
echo "teacher: $out/model"
