"""`grpo-ray eval --config <recipe>`: the held-out evaluation a run of the recipe does, in this
process (no Ray), on a model before or after training.

    grpo-ray eval --config configs/tiny-tools.yaml                    # the recipe's model, as at step 0
    grpo-ray eval --config configs/tiny-tools.yaml --model runs/tiny-tools/model --backend vllm

The recipe's held-out prompts (data.eval_files, else its validation split; data.eval_limit) are
sampled as its evaluation samples them (training/evaluation.py's eval_sampling: train.eval_samples
at train.eval_temperature, a stage's max_new_tokens, the seed of step 0) by a rollout worker built
from the recipe (rollout.backend, hf or vllm): with an environment (environment.spec) each sample
is an episode with it, as in training. The recipe's reward functions (and the environment's reward)
score them in a reward worker, and the accuracy is the run's eval/accuracy (heldout_metrics: the
first function's mean, a failed score counting 0). Episodes add their figures per sample: turns,
tool calls, tool errors and failures. `samples.jsonl` under --output-dir has one line per sample,
an episode's conversation included (training/sample_table.py); one MLflow run holds the recipe
(params), the metrics and the same table.

The eval options that are recipe fields set them (`recipe_overrides`): --model is model.path,
--data data.eval_files, --n train.eval_samples, --temperature train.eval_temperature, ...;
anything else is --set KEY=VALUE.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from grpo_ray.config import Config, ConfigError, config_to_dict, flatten, load_config, plan_stages
from grpo_ray.tracking import MlflowTracker, default_tracking_uri, redact_config
from grpo_ray.types import RolloutSlice, ScoredSlice

# The eval options that are a recipe's fields under --config.
OPTION_FIELDS = {
    "model": "model.path",
    "data": "data.eval_files",
    "backend": "rollout.backend",
    "n": "train.eval_samples",
    "temperature": "train.eval_temperature",
    "top_p": "rollout.top_p",
    "max_tokens": "rollout.max_new_tokens",
    "dtype": "model.dtype",
    "limit": "data.eval_limit",
    "seed": "seed",
}
# The eval options a recipe has no field for.
NOT_WITH_CONFIG = {
    "reward": "--reward: with --config the recipe's reward.functions score the samples; change them with --set",
    "yarn_factor": "--yarn-factor: not with --config; evaluate the model with --model and --data instead",
}
# The episode figures printed, per sample (ScoredSlice.episode_stats' names).
EPISODE_FIGURES = (("turns", "turns"), ("tool_calls", "tool calls"), ("tool_errors", "tool errors"))


def recipe_overrides(given: dict[str, Any], output_dir: str) -> list[str]:
    """--set overrides for the eval options given on the command line (`given`: option -> value),
    and the output folder (the engine's logs go there, not into the recipe's run)."""
    for name in given:
        if name in NOT_WITH_CONFIG:
            raise ConfigError(NOT_WITH_CONFIG[name])
    fields = {name: value for name, value in given.items() if name in OPTION_FIELDS}  # not --output-dir ...
    # JSON is YAML: a path or a list of paths stays what it is.
    overrides = [f"{OPTION_FIELDS[name]}={json.dumps(list(v) if name == 'data' else v)}" for name, v in fields.items()]
    return overrides + [f"output_dir={json.dumps(str(Path(output_dir).absolute()))}"]


def run_recipe_eval(
    config: str,
    overrides: tuple[str, ...],
    given: dict[str, Any],
    output_dir: str,
    tracking_uri: str | None,
    echo: Callable[[str], None] = print,
) -> RecipeEvalReport:
    """`grpo-ray eval --config`: the recipe with the options given and --set's overrides, evaluated."""
    from grpo_ray.quiet import quiet_driver

    cfg = load_config(config, [*recipe_overrides(given, output_dir), *overrides])
    quiet_driver()
    report = evaluate_recipe(cfg, tracking_uri, log=echo)
    for line in [
        *report.lines(),
        f"samples: {report.samples_file}",
        f"MLflow run {report.run_id}: {report.tracking_uri}",
    ]:
        echo(line)
    return report


@dataclass(frozen=True)
class RecipeEvalReport:
    k: int  # samples per prompt (train.eval_samples)
    prompts: int
    episodes: bool  # each sample an episode with the recipe's environment
    metrics: dict[str, float]  # as logged to MLflow: eval/accuracy, eval/reward_mean, eval/episode/*, timing/*
    samples_file: Path
    run_id: str
    tracking_uri: str

    @property
    def accuracy(self) -> float:
        return self.metrics["eval/accuracy"]

    def lines(self) -> list[str]:
        m = self.metrics
        lines = [f"held-out accuracy {self.accuracy:.3f} (avg@{self.k} over {self.prompts} prompts)"]
        lines += [
            f"  {key.removeprefix('eval/accuracy/')}: {m[key]:.3f}" for key in m if key.startswith("eval/accuracy/")
        ]
        if self.episodes:
            figures = ", ".join(f"{m[f'eval/episode/{name}']:.2f} {label}" for name, label in EPISODE_FIGURES)
            failed = m["eval/episode/failed"] * self.prompts * self.k
            lines.append(f"episodes: {figures} per sample; {failed:.0f} failed (the environment's error)")
        return lines


def episode_metrics(scored: ScoredSlice) -> dict[str, float]:
    """eval/episode/<name>: each episode figure's mean per sample (none for single answers)."""
    return {f"eval/episode/{name}": float(np.mean(values)) for name, values in scored.episode_stats.items()}


def heldout_only(cfg: Config) -> Config:
    """The recipe as far as its held-out prompts go: named eval files are read without the training
    files (a hub training set is not fetched to evaluate); else the validation split needs them."""
    if not cfg.data.eval_files:
        return cfg
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"train_files": cfg.data.eval_files})})


def evaluate_recipe(
    cfg: Config, tracking_uri: str | None = None, log: Callable[[str], None] = print
) -> RecipeEvalReport:
    """Sample and score the recipe's held-out prompts as its run does; see the module docstring."""
    from grpo_ray.models.hub import check_model_source
    from grpo_ray.training.evaluation import eval_sampling
    from grpo_ray.training.inputs import prepare_inputs

    for field, source in (("model.path", cfg.model.path), ("model.tokenizer", cfg.model.tokenizer)):
        if source:
            check_model_source(source, field)
    prompts = prepare_inputs(heldout_only(cfg)).eval_prompts
    if not prompts:
        raise ConfigError("data.eval_files: no held-out prompt to evaluate; name eval files or raise data.val_fraction")
    sampling = replace(eval_sampling(cfg, plan_stages(cfg)[0], step=0), keep_messages=True)
    output_dir = Path(cfg.output_dir)
    tracker = MlflowTracker(
        tracking_uri or default_tracking_uri(output_dir),
        "grpo-ray-eval",
        None,
        artifact_root=output_dir / "mlartifacts" if tracking_uri is None else None,
    )
    shown = redact_config(config_to_dict(cfg))
    tracker.log_config(flatten(shown), shown)
    with tracker.ending():
        metrics, rows = _sample_and_score(cfg, prompts, sampling, log)
        samples_file = output_dir / "samples.jsonl"
        samples_file.parent.mkdir(parents=True, exist_ok=True)
        samples_file.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        tracker.log_metrics(0, metrics)
        tracker.log_table(rows, "samples/eval.json")
        tracker.client.log_artifact(tracker.run_id, str(samples_file))
    episodes = cfg.environment.spec is not None
    k = sampling.samples_per_prompt
    return RecipeEvalReport(k, len(prompts), episodes, metrics, samples_file, tracker.run_id, tracker.tracking_uri)


def _sample_and_score(cfg: Config, prompts, sampling, log: Callable[[str], None]) -> tuple[dict, list[dict]]:
    """(metrics, sample table rows) of the held-out prompts: the run's rollout worker samples them
    (episodes with its environment), its reward worker scores them."""
    from grpo_ray.actors.reward import RewardWorker
    from grpo_ray.actors.rollout import RolloutWorker
    from grpo_ray.cluster.settings import reward_worker_args, rollout_settings
    from grpo_ray.training.evaluation import heldout_metrics
    from grpo_ray.training.sample_table import sample_rows

    timings: dict[str, float] = {}
    started = time.perf_counter()
    scorer = RewardWorker(*reward_worker_args(cfg))  # a bad reward spec fails before the model loads
    try:
        worker = RolloutWorker(rollout_settings(cfg, 0))
        timings["timing/load"] = time.perf_counter() - started
        env = cfg.environment.spec
        k, what = sampling.samples_per_prompt, "episode" if env else "completion"
        with_env = f" with {env.rpartition(':')[2]}" if env else ""
        log(f"sampling {len(prompts)} prompts x {k} {what}{'s' * (k > 1)}{with_env} on {cfg.rollout.backend}")
        started = time.perf_counter()
        try:
            batch: RolloutSlice = worker.generate(prompts, 0, sampling, 1)
        finally:
            worker.close()
        timings["timing/generate"] = time.perf_counter() - started
        started = time.perf_counter()
        scored = _with_reward_model(cfg, batch, scorer.score(batch))
        timings["timing/reward"] = time.perf_counter() - started
    finally:
        scorer.close()
    metrics = {**heldout_metrics(cfg, [scored]), **episode_metrics(scored), **timings}
    rows = sample_rows(batch, batch.num_rows, [None if np.isnan(r) else float(r) for r in scored.rewards])
    for row, scores in zip(rows, _row_scores(scored)):
        row["scores"] = scores
    return metrics, rows


def _with_reward_model(cfg: Config, batch: RolloutSlice, scored: ScoredSlice) -> ScoredSlice:
    """The reward model's score added at reward.model.weight, as the run's scoring adds it."""
    m = cfg.reward.model
    if not m.path:
        return scored
    from grpo_ray.actors.reward_model import RewardModelWorker

    model = RewardModelWorker(
        m.path, m.tokenizer, cfg.model.dtype, m.batch_size, cfg.learner.torch_threads, m.max_length
    )
    return scored.with_function("reward_model", model.score(batch), m.weight)


def _row_scores(scored: ScoredSlice) -> list[dict[str, float | None]]:
    """Each row's score of each function (None: it failed on the row)."""
    return [
        {name: None if np.isnan(v[i]) else float(v[i]) for name, v in scored.per_function.items()}
        for i in range(len(scored.rewards))
    ]
