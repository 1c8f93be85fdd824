"""grpo-ray end to end on one GPU, on-policy and pipelined, beside TRL's GRPOTrainer with colocated vLLM.

    python benchmarks/gpu_e2e.py --tokenizer PATH_TO_A_QWEN2_TOKENIZER --trl-python PYTHON [--json OUT.json]

Both sides train the same model on the same prompts with the same batch: a Qwen2.5-0.5B-shaped
model with random weights in bf16 (benchmarks/gpu_throughput.py builds it; no hub download), the
tiny task's prompts chat-templated with the Qwen2 tokenizer, `--prompts` prompts x `--samples`
completions of up to `--new-tokens` tokens a step, lr 1e-6, no KL, token-mean loss, one pass per
batch, and TRL's tl;dr length reward (-|characters - 100|: a random model's completions differ on
it, where exact match scores them all 0). grpo-ray runs the vllm backend (CUDA graphs) with the
learner and the engine on fractions of the one GPU; TRL runs vLLM inside its trainer
(`vllm_mode="colocate"`), in a Python of its own (`--trl-python`, with trl installed).

Measured: seconds per step and samples/s over the steps after `--warmup`, and grpo-ray's seconds
per phase (rollout, reward, update, sync: its MLflow timing/* metrics). A run that makes no step
for `--stall-seconds` is stopped: the JSON says so, and where py-spy is installed its stacks of
every process of the run are saved beside the log (what was waiting on what).

Writes a table (markdown) to stdout and the figures as JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from gpu_throughput import build_model  # noqa: E402
from qwen_vocab import _trl_prompts  # noqa: E402
from side_by_side import run_metrics, throughput  # noqa: E402

TINY = ROOT / "configs" / "tiny.yaml"
TARGET_CHARS = 100


MODE_OPTIONS = {  # a mode is "on-policy" or "pipelined", then any of these after "+"
    "broadcast": "weight_sync.same_device=broadcast",  # today's gloo path, for the hand-off's comparison
    "sleep1": "rollout.vllm.sleep_level=1",
    "sleep2": "rollout.vllm.sleep_level=2",
    # Adam's moments and the gradients in host memory between updates (with sleep1 or sleep2).
    "offload": "learner.zero_stage=2,learner.offload_states_between_updates=true",
    # vLLM's engine options (rollout.vllm.engine_args), for the rollout's figures (issue 46 point 3).
    "async": "rollout.vllm.engine_args.async_scheduling=true",
}


def mode_sets(mode: str) -> tuple[bool, list[str]]:
    """(pipelined, overrides) of a --modes entry: "on-policy", "pipelined", "on-policy+sleep1+mem0.7",
    "pipelined+broadcast", "on-policy+async+seqs512"; memN sets vLLM's gpu_memory_utilization to N for
    that run, seqsN its max_num_seqs, graphsN the batch sizes vLLM captures CUDA graphs at to the powers
    of two up to N (fewer graphs to capture at the start; a decode batch between two is padded up)."""
    base, *options = mode.split("+")
    if base not in ("on-policy", "pipelined"):
        raise SystemExit(f"--modes: {mode!r} starts with neither on-policy nor pipelined")
    sets = []
    for option in options:
        if option.startswith("mem"):
            sets.append(f"rollout.vllm.gpu_memory_utilization={float(option[3:])}")
        elif option.startswith("seqs"):  # vLLM's batch limit: sequences per engine step
            sets.append(f"rollout.vllm.engine_args.max_num_seqs={int(option[4:])}")
        elif option.startswith("graphs"):  # CUDA graphs at the powers of two up to N sequences only
            top = int(option[6:])
            sizes = [2**k for k in range(top.bit_length())]
            sets.append(f"rollout.vllm.engine_args.compilation_config={{cudagraph_capture_sizes: {sizes}}}")
        elif option in MODE_OPTIONS:
            sets.extend(MODE_OPTIONS[option].split(","))
        else:
            raise SystemExit(
                f"--modes: {option!r} in {mode!r} is none of {', '.join(MODE_OPTIONS)}, memN, seqsN, graphsN"
            )
    return base == "pipelined", sets


def grpo_sets(model_dir: Path | str, out: Path, args, pipelined: bool) -> list[str]:
    """The overrides of configs/tiny.yaml for the 0.5B shape (or, --shape tiny, the tiny model in
    fp32: the recipe the probe's false alarm was seen on) on one GPU."""
    tiny = str(model_dir) == "tiny"
    sets = [
        f"output_dir={out}",
        f"model.path={model_dir}",
        f"model.dtype={'float32' if tiny else 'bfloat16'}",
        f"train.steps={args.steps}",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        "data.eval_limit=4",
        "data.max_prompt_tokens=64",
        f"train.prompts_per_step={args.prompts}",
        f"rollout.samples_per_prompt={args.samples}",
        f"rollout.max_new_tokens={args.new_tokens}",
        "rollout.backend=vllm",
        "rollout.num_gpus=0.5",
        f"rollout.vllm.gpu_memory_utilization={args.vllm_memory}",
        "rollout.vllm.enforce_eager=false",
        f"rollout.vllm.max_model_len={128 if tiny else 512}",
        "learner.num_gpus=0.5",
        f"learner.micro_batch_size={args.micro_batch}",
        f"weight_sync.probe_every={args.probe_every}",
        f"tracking.tracking_uri=file://{out / 'mlruns'}",
    ]
    if args.probe_tolerance is not None:  # else the platform's default, which a user gets
        sets.append(f"weight_sync.probe_tolerance={args.probe_tolerance}")
    if not tiny:  # the tiny recipe keeps its own reward (exact match) and learning rate
        sets += [
            "learner.lr=1.0e-6",
            f"reward.functions=[{{name: tldr_length, options: {{target_chars: {TARGET_CHARS}}}}}]",
        ]
    if pipelined:
        sets.append("rollout.max_staleness=1")
    return sets


def watch(command: list[str], log: Path, stall_seconds: float, env: dict) -> dict:
    """Run `command`; stop it when no new 'step N' line came for stall_seconds (after the first).
    Returns {returncode, stalled_after_step, stacks}."""
    step_line = re.compile(r"\bstep (\d+)\b")
    with log.open("w") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )
        last_step, last_change = 0, time.monotonic()
        while proc.poll() is None:
            time.sleep(2)
            steps = [int(m) for m in step_line.findall(log.read_text(errors="replace"))]
            if steps and max(steps) > last_step:
                last_step, last_change = max(steps), time.monotonic()
            elif last_step and time.monotonic() - last_change > stall_seconds:
                stacks = _stacks(proc.pid, log.with_suffix(".stacks.txt"))
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                subprocess.run(["ray", "stop", "--force"], capture_output=True)
                return {"returncode": None, "stalled_after_step": last_step, "stacks": stacks}
    return {"returncode": proc.returncode, "stalled_after_step": None, "stacks": None}


def _stacks(root_pid: int, path: Path) -> str | None:
    """py-spy dumps of every process under root_pid and of Ray's workers (the actors), into path."""
    spy = shutil.which("py-spy")
    if spy is None:
        return None
    pids = subprocess.run(["pgrep", "-f", "ray::|grpo_ray|VLLM|python"], capture_output=True, text=True).stdout.split()
    with path.open("w") as out:
        for pid in pids:
            cmd = Path(f"/proc/{pid}/cmdline")
            name = cmd.read_text().replace("\0", " ")[:160] if cmd.exists() else "?"
            out.write(f"===== {pid} {name}\n")
            done = subprocess.run([spy, "dump", "--pid", pid], capture_output=True, text=True, timeout=60)
            out.write(done.stdout + done.stderr + "\n")
    return str(path)


def grpo_run(name: str, work: Path, model_dir: Path, args, mode: str) -> dict:
    out = work / name
    command = [sys.executable, "-m", "grpo_ray.cli", "train", str(TINY)]
    pipelined, extra = mode_sets(mode)
    for item in grpo_sets(model_dir, out, args, pipelined) + extra:
        command += ["--set", item]
    started = time.perf_counter()
    path = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    result = watch(command, work / f"{name}.log", args.stall_seconds, {**os.environ, "PYTHONPATH": path})
    result["wall_seconds"] = time.perf_counter() - started
    if result["returncode"] != 0:
        result["log_tail"] = (work / f"{name}.log").read_text(errors="replace")[-3000:]
        return result
    metrics = run_metrics(f"file://{out / 'mlruns'}")
    result.update(throughput(metrics, args.warmup, args.prompts * args.samples))
    for key in ("sync/probe_max_abs_diff", "sync/probe_undecided", "sync/probe_moved", "sync/probe_kernel_gap"):
        result[key.split("/")[1]] = [v for _, (v, _) in sorted(metrics.get(key, {}).items())]
    # Its start-up, phase by phase from the launch (training/startup.py), logged at the step it started from.
    result["startup"] = {k.split("/")[1]: v[min(v)][0] for k, v in metrics.items() if k.startswith("startup/")}
    steps = sorted(metrics["timing/step"])[args.warmup :]
    for key in ("sync/seconds", "sync/wake_seconds", "timing/sleep", "pipeline/ahead_generated_by_update_end"):
        if key in metrics:  # the hand-off's, sleep mode's and the overlap's own figures
            result[key] = sum(metrics[key][s][0] for s in steps if s in metrics[key]) / len(steps)
    return result


def trl_run(work: Path, model_dir: Path, args) -> dict:
    prompts = _trl_prompts(model_dir, work / "trl-prompts.jsonl")
    command = [
        args.trl_python,
        str(HERE / "trl_grpo.py"),
        "--model",
        str(model_dir),
        "--prompts",
        str(prompts),
        "--gpu",
        "--reward",
        "length",
        "--target-chars",
        str(TARGET_CHARS),
        "--steps",
        str(args.steps),
        "--warmup-steps",
        str(args.warmup),
        "--prompts-per-step",
        str(args.prompts),
        "--generations",
        str(args.samples),
        "--max-new-tokens",
        str(args.new_tokens),
        "--micro-batch",
        str(args.micro_batch),
        "--lr",
        "1e-6",
        "--vllm-gpu-memory-utilization",
        str(args.vllm_memory),
        "--output-dir",
        str(work / "trl-out"),
        "--json",
        str(work / "trl.json"),
    ]
    started = time.perf_counter()
    with (work / "trl.log").open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    if done.returncode != 0:
        return {"returncode": done.returncode, "log_tail": (work / "trl.log").read_text(errors="replace")[-3000:]}
    return {**json.loads((work / "trl.json").read_text()), "wall_seconds": time.perf_counter() - started}


def save_logs(work: Path, name: str, logs: Path) -> None:
    """The run's console log and its output folder's logs/ (vLLM's own lines) as logs/NAME-logs.tgz, written
    as soon as the run ends: a lent machine's call limit may end the benchmark before its last run."""
    import tarfile

    paths = [p for p in (work / f"{name}.log", work / f"{name}.stacks.txt", work / name / "logs") if p.exists()]
    if not paths:
        return
    logs.mkdir(parents=True, exist_ok=True)
    with tarfile.open(logs / f"{name}-logs.tgz", "w:gz") as tar:
        for path in paths:
            tar.add(path, arcname=path.relative_to(work))


def table(results: dict) -> str:
    rows = [
        "| run | s/step | samples/s | rollout | reward | update | sync | vs TRL |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    trl = results.get("trl", {}).get("samples_per_s")
    for name, r in results["runs"].items():
        if "samples_per_s" not in r:
            what = (
                f"stalled after step {r['stalled_after_step']}"
                if r.get("stalled_after_step")
                else f"failed ({r.get('returncode')})"
            )
            rows.append(f"| {name} | {what} | | | | | | |")
            continue
        p = r.get("phases", {})
        ratio = f"{r['samples_per_s'] / trl:.2f}x" if trl else ""
        rows.append(
            f"| {name} | {r['seconds_per_step']:.2f} | {r['samples_per_s']:.0f} | "
            + " | ".join(f"{p.get(k, float('nan')):.2f}" for k in ("rollout", "reward", "update", "sync"))
            + f" | {ratio} |"
        )
    return "\n".join(rows + ["", startup_table(results)])


def startup_table(results: dict) -> str:
    """Each grpo-ray run's seconds from its launch to its first step, phase by phase."""
    started = {name: r["startup"] for name, r in results["runs"].items() if r.get("startup")}
    if not started:
        return ""
    phases = list(next(iter(started.values())))
    rows = ["| run | " + " | ".join(phases) + " |", "| --- |" + " --- |" * len(phases)]
    for name, startup in started.items():
        rows.append(f"| {name} | " + " | ".join(f"{startup.get(p, float('nan')):.1f}" for p in phases) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["qwen2.5-0.5b", "tiny"], default="qwen2.5-0.5b")
    parser.add_argument(
        "--tokenizer", default=None, help="a Qwen2 tokenizer folder (tokenizer.json, tokenizer_config.json)"
    )
    parser.add_argument("--trl-python", default=None, help="a Python with trl installed; omitted: no TRL run")
    parser.add_argument(
        "--modes",
        default="on-policy,pipelined",
        help="comma-separated: on-policy or pipelined, + broadcast sleep1 sleep2 offload async memN seqsN graphsN",
    )
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=4, help="first steps left out of the rates")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--vllm-memory", type=float, default=0.3, help="vLLM's gpu_memory_utilization, both sides")
    # A probe at every sync at the default tolerance: the probe issue's GPU check (no false alarm in bf16).
    parser.add_argument("--probe-every", type=int, default=1)
    parser.add_argument("--probe-tolerance", type=float, default=None, help="default: weight_sync's own")
    parser.add_argument("--stall-seconds", type=float, default=120.0)
    parser.add_argument("--work", default=None, help="folder for the runs (default: a new temporary one)")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--logs", default=None, help="folder that gets each run's logs (a .tgz a run) the moment the run ends"
    )
    args = parser.parse_args()
    import torch

    # MLflow 3 reads a file store only when asked to (mlflow-skinny, as on the offline GPU machine,
    # has no sqlite store); the runs write one (tracking.tracking_uri).
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")

    work = Path(args.work or tempfile.mkdtemp(prefix="grpo-ray-gpu-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.shape == "tiny":
        model_dir = "tiny"
        args.trl_python = None  # the TRL comparison is of the 0.5B shape
    else:
        if not args.tokenizer:
            parser.error("--tokenizer is needed for the qwen2.5-0.5b shape")
        model_dir = work / "model"
        if not (model_dir / "config.json").exists():
            build_model("qwen2.5-0.5b", model_dir, args.tokenizer)
    results = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "settings": {k: v for k, v in vars(args).items() if k not in ("json",)},
        "runs": {},
    }
    try:
        import vllm

        results["vllm"] = vllm.__version__
    except ImportError:
        pass
    if args.trl_python:  # first: the pipelined run may stall and be stopped
        results["trl"] = trl_run(work, model_dir, args)
        print(json.dumps({"trl": results["trl"]}, default=str)[:2000], flush=True)
        if args.logs:
            save_logs(work, "trl", Path(args.logs))
    modes = args.modes.split(",")
    for i, mode in enumerate(modes):
        # A mode named twice runs twice (the start-up's second run finds vLLM's compile cache warm).
        again = f"-{i + 1}" if modes.count(mode) > 1 else ""
        name, folder = f"grpo-ray {mode}{again}", f"grpo-{mode}{again}"
        results["runs"][name] = grpo_run(folder, work, model_dir, args, mode)
        print(json.dumps({mode: results["runs"][name]}, default=str)[:2000], flush=True)
        if args.json:  # what is done so far survives a time limit
            Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
        if args.logs:
            save_logs(work, folder, Path(args.logs))
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
