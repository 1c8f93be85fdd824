"""grpo-ray and TRL's GRPOTrainer side by side on the tiny task, on this machine.

    bash scripts/setup.sh && bash benchmarks/setup_trl.sh
    .venv/bin/python benchmarks/side_by_side.py --json benchmarks/results/side_by_side.json

Both systems train the project's tiny model on the same prompts (the chat-templated token ids),
32 prompts x 8 completions of at most 5 tokens per step, lr 1e-4, no KL, token-mean loss, one
pass per batch, the same exact-match reward. Measured:

- samples/s of grpo-ray strictly on-policy and pipelined (rollout.max_staleness 1), and of TRL,
  over steady-state steps (the first `--warmup` left out), from the wall time between steps;
- grpo-ray's seconds per phase and its orchestration overhead: wall time per step minus the timed
  phases (rollout wait, reward, reference, advantages, update, sync), MLflow logging included;
- weight-sync GB/s next to a plain torch.distributed broadcast of the same bytes between the same
  processes (learner rank 0 -> rollout workers, in the sync's own group), for the tiny model
  (2 MB: fixed per-call costs) and, in a short run of its own, a wide random model of 269 MB;
- rollout tokens/s of the vllm backend against the hf backend (on-policy, the rollout phase);
- time to 60% held-out accuracy (greedy, 500 held-out problems, evaluated every 25 steps)
  against benchmarks/plain_grpo_loop.py, a single-process loop with the same model and settings:
  the median over --race-seeds seeds, each seed running every side back to back; grpo-ray
  pipelined and strictly on-policy, the ratio from the faster of the two.

Writes results/side_by_side.md (a table) and results/side_by_side.png (a chart) next to this
file, and the figures as JSON with --json.

With --qwen-vocab, the same comparison on a random Qwen2 with the real 151,936-token vocabulary
instead (benchmarks/qwen_vocab.py: seconds per phase, learner peak memory, samples/s, before and
after, TRL beside).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TINY = ROOT / "configs" / "tiny.yaml"
TRL_PYTHON = HERE / ".venv-trl" / "bin" / "python"
PHASES = ("rollout", "reward", "reference", "advantages", "sleep", "update", "sync")
# Two data-parallel learner ranks, one core's worth (and one torch thread) each, and one rollout
# worker. On-policy, generation has both cores to itself (configs/tiny.yaml's two threads);
# pipelined, it shares them with the update, and one thread was faster (809 vs 754 samples/s, before shared prompts).
LEARNERS = [
    "learner.num_workers=2",
    "learner.num_cpus=0.5",
    "learner.zero_stage=0",
    "learner.micro_batch_size=128",
    "learner.torch_threads=1",
]
PIPELINED = ["rollout.max_staleness=1", "rollout.torch_threads=1"]
# Weight sync at a model's size, inside a run: the wide random model, 2 prompts x 4 samples a step
# (its update takes ~1.5 s on 2 cores), a length reward so that groups differ and every step
# updates and syncs. The recipe's 64 MB buckets.
WIDE_STEPS = 10
WIDE = [
    f"train.steps={WIDE_STEPS}",
    "train.eval_every=0",
    "data.eval_limit=4",
    "weight_sync.probe_every=0",
    "weight_sync.measure_raw_broadcast=true",
    "train.prompts_per_step=2",
    "rollout.samples_per_prompt=4",
    "rollout.max_new_tokens=8",
    "reward.functions=[{name: length_words, options: {target_words: 2}}]",
]


def run(command: list[str], log: Path, result: Path, reuse: bool = False, tree: Path = ROOT) -> None:
    """Run a benchmark command (its output to log); with reuse, skip it when its result is there.
    `tree`: the grpo-ray checkout it runs (another commit's, for before/after figures)."""
    if reuse and result.exists():
        print(f"  {log.stem}: reused {result}", flush=True)
        return
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with log.open("w") as out:
        done = subprocess.run(command, cwd=tree, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(command[:4])} ... failed (exit {done.returncode}); its output is in {log}")
    print(f"  {log.stem}: {time.perf_counter() - started:.0f} s", flush=True)


def grpo_ray(name: str, work: Path, sets: list[str], reuse: bool = False, tree: Path = ROOT) -> dict:
    """Train the tiny recipe with these overrides; per-step metrics and their timestamps from MLflow."""
    out = work / name
    args = [a for s in [f"output_dir={out}", *sets] for a in ("--set", s)]
    run(
        [sys.executable, "-m", "grpo_ray.cli", "train", str(TINY), *args],
        work / f"{name}.log",
        out / "model",
        reuse,
        tree,
    )
    return run_metrics(f"sqlite:///{out / 'mlflow.db'}")


def run_metrics(tracking_uri: str) -> dict:
    """{metric: {step: (value, unix seconds)}} of the newest top-level run that logged steps."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("grpo-ray").experiment_id
    runs = [
        r
        for r in client.search_runs([experiment])
        if "mlflow.parentRunId" not in r.data.tags and "timing/step" in r.data.metrics
    ]
    run_ = max(runs, key=lambda r: r.info.start_time)
    metrics = {}
    for key in run_.data.metrics:
        history = sorted(client.get_metric_history(run_.info.run_id, key), key=lambda m: m.step)
        metrics[key] = {m.step: (m.value, m.timestamp / 1000) for m in history}
    return metrics


def values(metrics: dict, key: str, steps: list[int]) -> np.ndarray:
    return np.array([metrics[key][s][0] for s in steps])


def throughput(metrics: dict, warmup: int, completions_per_step: int) -> dict:
    steps = sorted(metrics["timing/step"])[warmup:]
    stamps = [metrics["timing/step"][s][1] for s in steps]
    wall = (stamps[-1] - stamps[0]) / (len(steps) - 1)  # seconds between step ends: everything the loop does
    phases = {p: float(values(metrics, f"timing/{p}", steps).mean()) for p in PHASES if f"timing/{p}" in metrics}
    tokens = float((values(metrics, "response/length_mean", steps) * completions_per_step).mean())
    rollout = phases["rollout"]
    return {
        "samples_per_s": completions_per_step / wall,
        "seconds_per_step": wall,
        "phases": phases,
        "overhead_fraction": max(wall - sum(phases.values()), 0.0) / wall,
        "rollout_tokens_per_s": tokens / rollout if rollout > 1e-3 else None,
        "sync_gbps": float(np.median(values(metrics, "sync/gbytes_per_s", steps))),
        "raw_broadcast_gbps": metrics.get("sync/raw_broadcast_gbps", {}).get(0, (None,))[0],
        "staleness": float(values(metrics, "batch/staleness", steps).mean()),
    }


def time_to_accuracy(metrics: dict, target: float) -> float | None:
    """Seconds from the end of the step-0 evaluation to the first evaluation at or above target."""
    curve = metrics["eval/accuracy"]
    reached = [s for s in sorted(curve) if s > 0 and curve[s][0] >= target]
    return curve[reached[0]][1] - curve[0][1] if reached else None


def accuracy_race(work: Path, target: float, seeds: int, reuse: bool) -> dict:
    """Seconds to `target` held-out accuracy: the plain loop, and grpo-ray pipelined and strictly
    on-policy (2 learner ranks each), seed by seed.

    One run of each is not a measurement here: the steps a seed needs vary by ~15%, and this
    machine's speed drifts by as much between minutes. So each seed runs every side back to back
    (the drift hits them alike), and the figures are medians over seeds. time_to_acc_ratio is the
    faster grpo-ray layout's median over the loop's.
    """
    layouts = {"pipelined": ("grpo-race", LEARNERS + PIPELINED), "on-policy": ("grpo-race-on-policy", LEARNERS)}
    reached: dict[str, list[tuple[float | None, int | None]]] = {"plain": [], **{name: [] for name in layouts}}
    for seed in range(seeds):
        name = f"plain-seed{seed}"
        run(
            [
                sys.executable,
                str(HERE / "plain_grpo_loop.py"),
                "--steps",
                "2000",
                "--eval-every",
                "25",
                "--seed",
                str(seed),
                "--target",
                str(target),
                "--json",
                str(work / f"{name}.json"),
            ],
            work / f"{name}.log",
            work / f"{name}.json",
            reuse,
        )
        curve = json.loads((work / f"{name}.json").read_text())["curve"]
        reached["plain"].append(next(((t, step) for step, t, acc in curve if step > 0 and acc >= target), (None, None)))
        for layout, (prefix, sets) in layouts.items():
            raced = grpo_ray(
                f"{prefix}-seed{seed}",
                work,
                sets + [f"seed={seed}", "train.steps=2000", "train.eval_every=25", f"train.stop_at_accuracy={target}"],
                reuse,
            )
            seconds = time_to_accuracy(raced, target)
            reached[layout].append((seconds, max(raced["eval/accuracy"]) if seconds is not None else None))

    def summary(runs: list[tuple[float | None, int | None]]) -> dict:
        seconds, steps = [t for t, _ in runs], [n for _, n in runs]
        done = None not in seconds
        return {
            "seconds": float(np.median(seconds)) if done else None,
            "steps": float(np.median(steps)) if done else None,
            "seconds_per_seed": seconds,
            "steps_per_seed": steps,
        }

    sides = {side: summary(runs) for side, runs in reached.items()}
    finished = [layout for layout in layouts if sides[layout]["seconds"] is not None]
    fastest = min(finished, key=lambda layout: sides[layout]["seconds"]) if finished else None
    plain = sides["plain"]["seconds"]
    return {
        "target": target,
        "seeds": seeds,
        "sides": sides,
        "fastest": fastest,
        "ratio": sides[fastest]["seconds"] / plain if fastest and plain else None,
    }


def wide_model(work: Path, hidden: int = 1024, layers: int = 4) -> Path:
    """The tiny model's tokenizer on a wide random Qwen2 (1024 x 4 layers, 268 MB of float32):
    weight sync at a model's size, inside a run. Its weights are random; only the bytes matter."""
    import torch
    from transformers import AutoConfig, Qwen2ForCausalLM

    from grpo_ray.models.loading import resolve_model_path

    tiny = Path(resolve_model_path("tiny"))
    out = work / "wide-model"
    if (out / "config.json").exists():
        return out
    config = AutoConfig.from_pretrained(tiny)
    config.update(
        {
            "hidden_size": hidden,
            "intermediate_size": 4 * hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": hidden // 64,
            "num_key_value_heads": hidden // 64,
            "head_dim": 64,
            "layer_types": ["full_attention"] * layers,
        }
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (tiny / name).exists():
            shutil.copy(tiny / name, out / name)
    return out


def prepare_prompts(work: Path) -> tuple[str, Path]:
    """The tiny model's folder and its training prompts as chat-templated text that re-tokenises
    to exactly the token ids grpo-ray samples from."""
    from grpo_ray.data.loaders import load_rows
    from grpo_ray.data.prompts import tokenize_prompts
    from grpo_ray.models.loading import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer("tiny")
    prompts = tokenize_prompts(load_rows("tiny:train")[0], tokenizer, 32, True).prompts
    path = work / "prompts.jsonl"
    with path.open("w") as f:
        for prompt in prompts:
            text = tokenizer.decode(prompt.token_ids)
            if list(tokenizer(text, add_special_tokens=False).input_ids) != list(prompt.token_ids):
                sys.exit(
                    f"error: prompt {prompt.uid} does not re-tokenise to the same ids; the comparison would be unfair"
                )
            f.write(json.dumps({"prompt": text, "answer": prompt.answer}) + "\n")
    return resolve_model_path("tiny"), path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps of each throughput run")
    parser.add_argument("--warmup", type=int, default=8, help="first steps left out of the rates")
    parser.add_argument("--target", type=float, default=0.6, help="held-out accuracy of the time-to-accuracy race")
    parser.add_argument(
        "--race-seeds", type=int, default=3, help="seeds of the time-to-accuracy race (each runs both sides)"
    )
    parser.add_argument(
        "--skip-accuracy", action="store_true", help="leave out the time-to-accuracy race (~8 min a seed)"
    )
    parser.add_argument("--skip-vllm", action="store_true", help="leave out the vllm backend's rollout run")
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders (printed)")
    parser.add_argument(
        "--reuse",
        default=None,
        metavar="DIR",
        help="a folder kept with --keep: runs finished there are not run again (re-renders the figures)",
    )
    parser.add_argument(
        "--qwen-vocab",
        action="store_true",
        help="the Qwen-vocabulary mode instead (benchmarks/qwen_vocab.py): a random Qwen2 with the real tokenizer",
    )
    parser.add_argument(
        "--before-tree",
        default=None,
        metavar="DIR",
        help="--qwen-vocab: a checkout of the code to compare against (e.g. `git archive 74293a5`)",
    )
    parser.add_argument(
        "--qwen-tokenizer",
        default="/work/shared/tokenizers/qwen2",
        metavar="DIR",
        help="--qwen-vocab: the Qwen2 tokenizer files (tokenizer.json, tokenizer_config.json, chat_template.jinja)",
    )
    args = parser.parse_args()
    if args.qwen_vocab:
        from qwen_vocab import run_mode

        run_mode(args, sys.modules[__name__])
        return
    if not TRL_PYTHON.exists():
        sys.exit(f"error: {TRL_PYTHON} is missing; run `bash benchmarks/setup_trl.sh` first")
    os.environ.setdefault("GRPO_RAY_CACHE", str(ROOT / ".cache" / "grpo-ray"))
    work = Path(args.reuse) if args.reuse else Path(tempfile.mkdtemp(prefix="grpo-ray-bench-"))
    reuse = bool(args.reuse)
    completions = 32 * 8
    short = [
        f"train.steps={args.steps}",
        "train.eval_every=0",
        "data.eval_limit=20",
        "weight_sync.probe_every=0",
        "weight_sync.measure_raw_broadcast=true",
    ]
    print(f"runs in {work}", flush=True)

    model_dir, prompts = prepare_prompts(work)
    run(
        [
            str(TRL_PYTHON),
            str(HERE / "trl_grpo.py"),
            "--model",
            model_dir,
            "--prompts",
            str(prompts),
            "--steps",
            str(args.steps),
            "--warmup-steps",
            str(args.warmup),
            "--output-dir",
            str(work / "trl-out"),
            "--json",
            str(work / "trl.json"),
        ],
        work / "trl.log",
        work / "trl.json",
        reuse,
    )
    trl = json.loads((work / "trl.json").read_text())
    on_policy = throughput(grpo_ray("grpo-on-policy", work, short + LEARNERS, reuse), args.warmup, completions)
    pipelined = throughput(
        grpo_ray("grpo-pipelined", work, short + LEARNERS + PIPELINED, reuse), args.warmup, completions
    )
    single = throughput(grpo_ray("grpo-one-learner", work, short, reuse), args.warmup, completions)
    vllm = None
    if not args.skip_vllm:
        vllm = throughput(
            grpo_ray("grpo-vllm", work, short + ["rollout.backend=vllm"], reuse), args.warmup, completions
        )

    wide = grpo_ray("grpo-sync-wide", work, WIDE + [f"model.path={wide_model(work)}"], reuse)
    wide_steps = sorted(wide["sync/gbytes_per_s"])[2:]  # the first syncs touch fresh pages
    sync_wide = {
        "megabytes": wide["sync/megabytes"][wide_steps[0]][0],
        "sync_gbps": float(np.median(values(wide, "sync/gbytes_per_s", wide_steps))),
        "raw_broadcast_gbps": wide["sync/raw_broadcast_gbps"][0][0],
        "syncs": len(wide_steps),
    }
    sync_wide["fraction"] = sync_wide["sync_gbps"] / sync_wide["raw_broadcast_gbps"]

    race = None
    if not args.skip_accuracy:
        race = accuracy_race(work, args.target, args.race_seeds, reuse)

    # The headline: grpo-ray's fastest correct configuration against TRL. Which one wins
    # depends on the machine (on 2 cores, pipelining makes generation and the update share them).
    configurations = {
        "on-policy, 2 learner ranks": on_policy,
        "pipelined, 2 learner ranks": pipelined,
        "on-policy, 1 learner": single,
    }
    fastest = max(configurations, key=lambda name: configurations[name]["samples_per_s"])
    figures = {
        "grpo_samples_per_s": configurations[fastest]["samples_per_s"],
        "grpo_fastest": fastest,
        "grpo_pipelined_samples_per_s": pipelined["samples_per_s"],
        "grpo_on_policy_samples_per_s": on_policy["samples_per_s"],
        "grpo_one_learner_samples_per_s": single["samples_per_s"],
        "trl_samples_per_s": trl["samples_per_s"],
        "ratio": configurations[fastest]["samples_per_s"] / trl["samples_per_s"],
        "pipelined_ratio": pipelined["samples_per_s"] / trl["samples_per_s"],
        "on_policy_ratio": on_policy["samples_per_s"] / trl["samples_per_s"],
        # The larger of the two, so the figure is never the flattering one.
        "overhead_fraction": max(pipelined["overhead_fraction"], on_policy["overhead_fraction"]),
        "pipelined_overhead_fraction": pipelined["overhead_fraction"],
        "on_policy_overhead_fraction": on_policy["overhead_fraction"],
        "sync_gbps": pipelined["sync_gbps"],
        "raw_broadcast_gbps": pipelined["raw_broadcast_gbps"],
        "phases_pipelined": pipelined["phases"],
        "phases_on_policy": on_policy["phases"],
        "sync_wide": sync_wide,
        "hf_rollout_tokens_per_s": single["rollout_tokens_per_s"],
        "vllm_rollout_tokens_per_s": vllm["rollout_tokens_per_s"] if vllm else None,
        "time_to_acc_ratio": race["ratio"] if race else None,
        "time_to_acc": race,
        "trl_version": trl["trl_version"],
        "trl_torch_threads": trl["torch_threads"],
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "machine": f"{os.cpu_count()} cores, no GPU",
        "date": time.strftime("%Y-%m-%d"),
    }
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    (results / "side_by_side.md").write_text(markdown(figures))
    chart(figures, results / "side_by_side.png")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    print(markdown(figures))
    if args.keep:
        print(f"runs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def markdown(f: dict) -> str:
    def num(value, fmt="{:.0f}"):
        return "n/a" if value is None else fmt.format(value)

    race = f["time_to_acc"] or {}

    def race_row(side: str, label: str) -> str:
        """'| time to 60% ..., median of 3 seeds (171 s/600, ... steps) | 182 s (650 steps) |'"""
        figures = race.get("sides", {}).get(side)
        if figures is None:
            return f"| time to {race.get('target', 0.6):.0%} held-out accuracy, {label} | n/a |"
        runs = ", ".join(f"{num(t)} s/{num(n)}" for t, n in zip(figures["seconds_per_seed"], figures["steps_per_seed"]))
        return (
            f"| time to {race['target']:.0%} held-out accuracy, {label}, median of {race['seeds']} seeds "
            f"({runs} steps) "
            f"| {num(figures['seconds'])} s ({num(figures['steps'])} steps) |"
        )

    lines = [
        f"Measured {f['date']} on {f['machine']}: tiny model, 32 prompts x 8 completions of at most 5 tokens per step, "
        f"{f['steps']} steps ({f['warmup_steps']} warm-up steps left out); TRL {f['trl_version']} with "
        f"{f['trl_torch_threads']} torch threads.",
        "",
        "| | samples/s | vs TRL |",
        "|---|---:|---:|",
        f"| TRL GRPOTrainer | {num(f['trl_samples_per_s'])} | 1.00x |",
        f"| grpo-ray, on-policy, 1 learner | {num(f['grpo_one_learner_samples_per_s'])} | "
        f"{f['grpo_one_learner_samples_per_s'] / f['trl_samples_per_s']:.2f}x |",
        f"| grpo-ray, on-policy, 2 learner ranks | {num(f['grpo_on_policy_samples_per_s'])} | "
        f"{f['on_policy_ratio']:.2f}x |",
        f"| grpo-ray, pipelined (max_staleness 1), 2 learner ranks | {num(f['grpo_pipelined_samples_per_s'])} | "
        f"{f['pipelined_ratio']:.2f}x |",
        f"| **grpo-ray, fastest ({f['grpo_fastest']})** | **{num(f['grpo_samples_per_s'])}** | **{f['ratio']:.2f}x** |",
        "",
        "| grpo-ray, seconds per step | " + " | ".join(f["phases_pipelined"]) + " | overhead |",
        "|---|" + "---:|" * (len(f["phases_pipelined"]) + 1),
        "| on-policy | "
        + " | ".join(f"{v:.3f}" for v in f["phases_on_policy"].values())
        + f" | {f['on_policy_overhead_fraction']:.1%} |",
        "| pipelined | "
        + " | ".join(f"{v:.3f}" for v in f["phases_pipelined"].values())
        + f" | {f['pipelined_overhead_fraction']:.1%} |",
        "",
        "| | value |",
        "|---|---:|",
        f"| weight sync | {num(f['sync_gbps'], '{:.3f}')} GB/s |",
        "| the yardstick of the same bytes, same processes (a plain broadcast; with the same-device hand-off, "
        f"a plain copy on the device) | {num(f['raw_broadcast_gbps'], '{:.3f}')} GB/s |",
        f"| weight sync of a {f['sync_wide']['megabytes']:.0f} MB model in a run (wide random Qwen2, 64 MB "
        "buckets; median of "
        f"{f['sync_wide']['syncs']} syncs) | {f['sync_wide']['sync_gbps']:.3f} GB/s |",
        "| the yardstick of the same bytes, same processes (a plain broadcast; with the same-device hand-off, "
        f"a plain copy on the device) | {f['sync_wide']['raw_broadcast_gbps']:.3f} GB/s |",
        f"| weight sync / plain broadcast: tiny model, {f['sync_wide']['megabytes']:.0f} MB model "
        f"| {f['sync_gbps'] / f['raw_broadcast_gbps']:.0%}, {f['sync_wide']['fraction']:.0%} |",
        f"| rollout tokens/s, hf backend | {num(f['hf_rollout_tokens_per_s'])} |",
        f"| rollout tokens/s, vllm backend | {num(f['vllm_rollout_tokens_per_s'])} |",
        race_row("plain", "plain single-process loop"),
        race_row("pipelined", "grpo-ray pipelined, 2 learner ranks"),
        race_row("on-policy", "grpo-ray on-policy, 2 learner ranks"),
        f"| time_to_acc_ratio (grpo-ray's faster layout, {race.get('fastest') or 'n/a'}, / plain loop) | "
        f"{num(f['time_to_acc_ratio'], '{:.2f}')} |",
    ]
    return "\n".join(lines) + "\n"


def chart(f: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [
        "TRL",
        "grpo-ray\non-policy\n1 learner",
        "grpo-ray\non-policy\n2 learners",
        "grpo-ray\npipelined\n2 learners",
    ]
    rates = [
        f["trl_samples_per_s"],
        f["grpo_one_learner_samples_per_s"],
        f["grpo_on_policy_samples_per_s"],
        f["grpo_pipelined_samples_per_s"],
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar(names, rates, color=["#999999", "#8fb3d9", "#4a7fb5", "#1f4e79"])
    for bar, rate in zip(bars, rates):
        ax.text(
            bar.get_x() + bar.get_width() / 2,
            rate,
            f"{rate:.0f}\n({rate / rates[0]:.2f}x)",
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_ylabel("samples (completions) per second")
    ax.set_title(f"GRPO on the tiny task, {f['machine']}")
    ax.set_ylim(0, max(rates) * 1.25)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
