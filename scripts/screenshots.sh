#!/usr/bin/env bash
# The README's pictures, from real runs: two short tiny runs (learning rates 1e-4 and 3e-4) in one
# MLflow store, the Ray dashboard's actors page while the second runs, the MLflow comparison of
# their reward and accuracy curves, and `grpo-ray runs compare --plot`.
#
#   bash scripts/screenshots.sh [out_dir]        # PNGs into docs/, runs into out_dir (a temp dir)
#
# Needs Debian's chromium (apt-get install -y chromium) for the headless screenshots; every server
# it starts listens on 127.0.0.1 and is stopped on exit.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
MLFLOW="$(dirname "$PY")/mlflow"
OUT="${1:-$(mktemp -d)}"
DOCS="$ROOT/docs"
STEPS="${STEPS:-40}"
mkdir -p "$OUT" "$DOCS"
STORE="sqlite:///$OUT/mlflow.db"
command -v chromium >/dev/null || { echo "chromium not found: apt-get install -y chromium" >&2; exit 1; }

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

train() {  # name lr [extra --set ...]
  local name=$1 lr=$2; shift 2
  "$PY" -m grpo_ray.cli train "$ROOT/configs/tiny.yaml" --no-resume \
    --set "output_dir=$OUT/$name" --set "tracking.tracking_uri=$STORE" --set "tracking.run_name=$name" \
    --set "train.steps=$STEPS" --set train.eval_every=10 --set data.eval_limit=200 --set "learner.lr=$lr" "$@"
}

shoot() {  # url png [wait ms]
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,900 \
    --virtual-time-budget="${3:-20000}" --screenshot="$2" "$1" 2>/dev/null
  echo "wrote $2 ($(du -k "$2" | cut -f1) KB)"
}

# 1. The first run, to its end.
train lr-1e-4 1e-4 | tee "$OUT/lr-1e-4.log"

# 2. The second run with the Ray dashboard; its actors page while it trains. Without token
# authentication for this throw-away run only (everything still listens on 127.0.0.1): with it,
# a headless browser gets the dashboard's token prompt instead of the page.
RAY_AUTH_MODE=disabled train lr-3e-4 3e-4 --set ray.dashboard=true > "$OUT/lr-3e-4.log" 2>&1 &
pids+=($!)
until grep -q "^step 5/" "$OUT/lr-3e-4.log"; do
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$OUT/lr-3e-4.log"; exit 1; }
  sleep 1
done
DASHBOARD="$(grep -o 'Ray dashboard http://[0-9.:]*' "$OUT/lr-3e-4.log" | cut -d' ' -f3)"
shoot "$DASHBOARD/#/actors" "$DOCS/ray-dashboard-actors.png" 15000
wait "${pids[0]}"
tail -3 "$OUT/lr-3e-4.log"

# 3. MLflow's comparison of the two runs: reward and held-out accuracy curves in one chart.
PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$MLFLOW" ui --backend-store-uri "$STORE" --host 127.0.0.1 --port "$PORT" > "$OUT/mlflow-ui.log" 2>&1 &
pids+=($!)
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do sleep 1; done
read -r EXPERIMENT RUNS < <("$PY" - "$STORE" <<'EOF'
import json, sys
from mlflow.tracking import MlflowClient
client = MlflowClient(sys.argv[1])
experiment = client.get_experiment_by_name("grpo-ray").experiment_id
runs = [r.info.run_id for r in client.search_runs([experiment]) if "mlflow.parentRunId" not in r.data.tags]
print(experiment, json.dumps(runs, separators=(",", ":")))
EOF
)
json_uri() { printf %s "$1" | jq -sRr @uri; }
QUERY="runs=$(json_uri "$RUNS")&metric=$(json_uri '"reward/mean"')&experiments=$(json_uri "[\"$EXPERIMENT\"]")"
QUERY="$QUERY&plot_metric_keys=$(json_uri '["reward/mean","eval/accuracy"]')"
shoot "http://127.0.0.1:$PORT/#/metric?$QUERY" "$DOCS/mlflow-compare.png"

# 4. The same comparison from the command line.
"$PY" -m grpo_ray.cli runs compare --experiment grpo-ray --tracking-uri "$STORE" --plot "$DOCS/runs-compare.png" \
  | tee "$DOCS/runs-compare.txt"
