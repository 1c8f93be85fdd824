#!/bin/bash
# Old and new vllm engines interleaved (old new old new ...), so that other load on the machine
# falls on both alike; then each one's median and range per --max-new-tokens.
#
#   OLD=/path/to/worktree/at/482fb90 benchmarks/engine_tokens_ab.sh [REPS] [CALLS] [MAX_NEW_TOKENS]
#
# OLD is a checkout of the former engine with this benchmark copied into it; the default runs
# each 3 times, 16 calls each, at 5 and 64 new tokens. Raw figures: one JSON line per run and
# setting in $OUT.old / $OUT.new; the summary goes to benchmarks/results/engine_tokens.json.
set -euo pipefail
reps=${1:-3}; calls=${2:-16}; tokens=${3:-5,64}
here=$(cd "$(dirname "$0")/.." && pwd)
old=${OLD:?OLD=a worktree of the former engine}
python=${PYTHON:-$here/.venv/bin/python}
out=${OUT:-$(mktemp -d)/engine_tokens}
for rep in $(seq "$reps"); do
  for side in old new; do
    root=$here; [ "$side" = old ] && root=$old
    (cd "$here" && OMP_WAIT_POLICY=PASSIVE PYTHONPATH=$root "$python" "$root/benchmarks/engine_tokens.py" vllm \
      --calls "$calls" --max-new-tokens "$tokens" --json "$out.$side" 2>/dev/null | grep -E '^vllm [0-9]+:' | sed "s/^/$rep $side: /")
  done
done
"$python" "$here/benchmarks/engine_tokens_summary.py" "$out.old" "$out.new" > "$here/benchmarks/results/engine_tokens.json"
cat "$here/benchmarks/results/engine_tokens.json"
