"""How long `grpo-ray train` takes to start, phase by phase, on the hf and the vllm engine.

    .venv/bin/python benchmarks/startup.py --json benchmarks/results/startup.json

Launches `grpo-ray train configs/tiny.yaml --set train.steps=1` --runs times per engine, each a
fresh process with a fresh output folder (a new MLflow store, a new local Ray), one after another
on an otherwise idle machine, and reads the start-up table each run logs (training/startup.py:
startup/<phase>, from the process's launch to the first step). Prints, per engine, each phase's
median (min-max) seconds and writes them as JSON. Issue 55's aim on a 2-core machine: 15 s on hf,
30 s on vllm.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from recorded import training_run, write_results

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RECIPE = ROOT / "configs" / "tiny.yaml"
ENGINES = {"hf": [], "vllm": ["rollout.backend=vllm", "rollout.vllm.cpu_kv_cache_gb=0.25"]}


def one_run(work: Path, engine: str, index: int) -> dict[str, float]:
    """One launch to its first step: the startup/* metrics it logged, and the wall seconds to its end."""
    out = work / f"{engine}-{index}"
    sets = [f"output_dir={out}", "train.steps=1", *ENGINES[engine]]
    command = [sys.executable, "-m", "grpo_ray.cli", "train", str(RECIPE)] + [a for s in sets for a in ("--set", s)]
    launched = time.time()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(
            f"error: {engine} run {index} failed (exit {done.returncode}): {done.stdout[-1500:]}{done.stderr[-1500:]}"
        )
    _, run = training_run(f"sqlite:///{out / 'mlflow.db'}")
    phases = {k.removeprefix("startup/"): v for k, v in run.data.metrics.items() if k.startswith("startup/")}
    line = next(line for line in done.stdout.splitlines() if line.startswith("start-up:"))
    print(f"{engine} {index}: {line}", flush=True)
    return phases | {"whole_run": time.time() - launched}


def summary(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        phase: {
            "median": statistics.median(r[phase] for r in runs),
            "min": min(r[phase] for r in runs),
            "max": max(r[phase] for r in runs),
        }
        for phase in runs[0]
    }


def markdown(found: dict) -> str:
    engines = list(found["engines"])
    phases = list(found["engines"][engines[0]]["summary"])
    lines = [
        f"# Start-up of `grpo-ray train configs/tiny.yaml` ({found['date']}, {found['machine']})",
        "",
        f"Seconds from the process's launch, median (min-max) of {found['runs']} runs per engine.",
        "",
        "| phase | " + " | ".join(engines) + " |",
        "| --- |" + " --- |" * len(engines),
    ]
    for phase in phases:
        cells = []
        for engine in engines:
            s = found["engines"][engine]["summary"][phase]
            cells.append(f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})")
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--engines", default="hf,vllm", help="comma-separated, of " + ", ".join(ENGINES))
    parser.add_argument("--json", type=Path, default=HERE / "results" / "startup.json")
    args = parser.parse_args()
    found = {
        "date": date.today().isoformat(),
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU",
        "recipe": "configs/tiny.yaml",
        "runs": args.runs,
        "engines": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for engine in args.engines.split(","):
            runs = [one_run(Path(tmp), engine, i) for i in range(args.runs)]
            found["engines"][engine] = {"runs": runs, "summary": summary(runs)}
    write_results(args.json, found, markdown(found))


if __name__ == "__main__":
    main()
