"""Benchmark a model: `grpo-ray eval`, in this process, no Ray.

    grpo-ray eval --model Qwen/Qwen2.5-Math-1.5B --backend vllm --dtype bfloat16 \\
        --data aime24.parquet --data amc23.parquet --n 16 --temperature 0.6 --top-p 0.95

Each file is read through the dataset loaders (verl parquet, jsonl, hub ids, tiny:heldout...),
every prompt gets the chat template, K = --n completions are sampled per prompt with the rollout
engine (transformers or vLLM) and scored with one reward function (default `math`) in a
killable subprocess, by the scorer the run uses (`rewards/scorer.py`). Per data source (the row's
`data_source` field, else the file's stem):

    avg@k   mean over prompts of the mean score of its K samples;
    pass@k  mean over prompts of the best score of its K samples (for 0/1 rewards such as math
            and exact_match: the fraction of prompts solved at least once).

A sample the reward could not score (None) counts as 0 and is counted in `failures`.
`samples.jsonl` under --output-dir holds every sample; one MLflow run holds the settings (params)
and `eval/<source>/avg_at_<k>`, `eval/<source>/pass_at_<k>`: MLflow refuses "@" in metric names.

`--yarn-factor F` evaluates with YaRN rope scaling over the model's own context length (the original
`max_position_embeddings`), without touching the checkpoint: hf builds the model from its config
with the rope fields set, vLLM gets the same fields through `hf_overrides`.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from grpo_ray.actors.engines import EngineSpec, build_engine
from grpo_ray.config import ConfigError
from grpo_ray.data.loaders import check_data_path, load_rows, resolve_data_path
from grpo_ray.data.prompts import tokenize_prompts
from grpo_ray.models.hub import check_model_source
from grpo_ray.models.loading import ModelLoadError, load_tokenizer, resolve_model_path
from grpo_ray.commands.rewards_score import ScoringRow, row_fields_of
from grpo_ray.rewards.scorer import RowScorer
from grpo_ray.rewards import load_reward_function
from grpo_ray.rewards.accuracy import accuracy_scores, failed_count, mean_accuracy
from grpo_ray.tracking import MlflowTracker, default_tracking_uri
from grpo_ray.types import Completion, Prompt, SamplingSettings


@dataclass(frozen=True)
class EvalSettings:
    """What to evaluate and how; the fields of `grpo-ray eval`'s options. Checked on creation."""

    model: str  # hub id, local folder, or "tiny"
    data: tuple[str, ...]  # files, hub ids or tiny:heldout
    n: int = 1  # K: samples per prompt
    temperature: float = 1.0  # 0 is greedy (then n must be 1)
    top_p: float = 1.0
    max_tokens: int = 1024  # longest completion
    backend: str = "hf"  # "hf" | "vllm"
    reward: str = "math"  # reward spec, as in a recipe
    yarn_factor: float | None = None  # YaRN rope scaling factor; None: the model's own rope
    output_dir: str = "runs/eval"
    tracking_uri: str | None = None  # None: sqlite under output_dir
    dtype: str = "float32"
    limit: int | None = None  # first N prompts of each file
    seed: int = 0
    experiment: str = "grpo-ray-eval"
    batch_size: int = 64  # prompts per generate call with hf (vLLM batches by itself)
    reward_timeout_s: float = 30.0  # per scoring call, in the reward subprocess
    apply_chat_template: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", tuple(self.data))
        checks = [
            (bool(self.data), "--data: give at least one file"),
            (self.n >= 1, f"--n {self.n}: must be >= 1"),
            (self.temperature >= 0, f"--temperature {self.temperature}: must be >= 0 (0 is greedy)"),
            (
                self.n == 1 or self.temperature > 0,
                f"--n {self.n} with --temperature 0: greedy samples are identical; give --temperature > 0 or --n 1",
            ),
            (0 < self.top_p <= 1, f"--top-p {self.top_p}: must be in (0, 1]"),
            (self.max_tokens >= 1, f"--max-tokens {self.max_tokens}: must be >= 1"),
            (self.backend in ("hf", "vllm"), f"--backend {self.backend}: use hf or vllm"),
            (self.yarn_factor is None or self.yarn_factor >= 1, f"--yarn-factor {self.yarn_factor}: must be >= 1"),
            (self.limit is None or self.limit >= 1, f"--limit {self.limit}: must be >= 1"),
            (self.batch_size >= 1, f"batch_size {self.batch_size}: must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)


@dataclass(frozen=True)
class EvalPrompt:
    source: str  # data source: the row's data_source, else the file's stem
    prompt: Prompt


@dataclass(frozen=True)
class SourceResult:
    source: str
    prompts: int
    avg_at_k: float  # mean over prompts of the mean of its K scores
    pass_at_k: float  # mean over prompts of the best of its K scores
    failures: int  # samples the reward could not score (counted as 0)
    truncated: float  # fraction of samples that hit max_tokens


@dataclass(frozen=True)
class EvalReport:
    k: int
    sources: list[SourceResult]
    samples_file: Path
    run_id: str
    tracking_uri: str
    metrics: dict[str, float]  # as logged to MLflow
    rope_parameters: dict[str, Any] | None  # the rope settings of the model as loaded

    def table_lines(self) -> list[str]:
        width = max(len("source"), *(len(s.source) for s in self.sources))
        k = self.k
        lines = [
            f"{'source':<{width}}  {'prompts':>7}  {f'avg@{k}':>8}  {f'pass@{k}':>8}  {'failures':>8}  {'truncated':>9}"
        ]
        for s in self.sources:
            lines.append(
                f"{s.source:<{width}}  {s.prompts:>7}  {s.avg_at_k:>8.4f}  {s.pass_at_k:>8.4f}  {s.failures:>8} "
                f" {s.truncated:>9.1%}"
            )
        return lines


# ---- pure pieces -------------------------------------------------------------------------------


def source_name(fields: dict[str, Any], spec: str) -> str:
    """The row's `data_source`, else the stem of the file it came from."""
    value = fields.get("data_source")
    if isinstance(value, str) and value.strip():
        return value.strip()
    return Path(resolve_data_path(spec)).stem or spec


# Characters MLflow refuses in metric names, and ':' (refused on Windows).
_NOT_IN_METRIC_NAMES = re.compile(r"[^/\w.\- ]")


def metric_key(source: str, name: str) -> str:
    """`eval/<source>/<name>`, with characters MLflow would refuse as '_'."""
    return f"eval/{_NOT_IN_METRIC_NAMES.sub('_', source)}/{name}"


def summarize(sources: list[str], scores: list[list[float | None]], truncated: list[list[bool]]) -> list[SourceResult]:
    """Per source, in first-seen order. sources [P], scores [P][K] (None: could not score), truncated [P][K]."""
    results = []
    for source in dict.fromkeys(sources):
        rows = [i for i, s in enumerate(sources) if s == source]
        values = [accuracy_scores(scores[i]) for i in rows]  # a failed sample counts as wrong
        samples = sum(len(v) for v in values)
        results.append(
            SourceResult(
                source=source,
                prompts=len(rows),
                # Every prompt has K samples, so the mean of per-prompt means is the mean over samples.
                avg_at_k=mean_accuracy(np.concatenate(values)),
                pass_at_k=sum(float(v.max()) for v in values) / len(rows),
                failures=sum(failed_count(scores[i]) for i in rows),
                truncated=sum(t for i in rows for t in truncated[i]) / samples,
            )
        )
    return results


def yarn_rope_override(config, factor: float) -> dict[str, dict]:
    """{config attribute: value} that turns on YaRN by `factor` over the model's context length.

    transformers >= 5 keeps every rope setting in `rope_parameters` (rope_theta included), so the
    YaRN fields are merged into it; older versions keep them apart in `rope_scaling`.
    """
    yarn = {
        "rope_type": "yarn",
        "factor": float(factor),
        "original_max_position_embeddings": config.max_position_embeddings,
    }
    if hasattr(config, "rope_parameters"):
        return {"rope_parameters": {**(config.rope_parameters or {}), **yarn}}
    return {"rope_scaling": yarn}


def model_rope(config) -> dict[str, Any] | None:
    """The rope settings a loaded model config carries (rope_parameters, else rope_scaling)."""
    value = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    return dict(value) if value else None


# ---- the engines -------------------------------------------------------------------------------


def load_engine(settings: EvalSettings, tokenizer, max_model_len: int):
    """The rollout engine of `settings.backend`, with the YaRN override when asked."""
    model_path = resolve_model_path(settings.model)
    overrides = {}
    if settings.yarn_factor is not None:
        from transformers import AutoConfig

        overrides = yarn_rope_override(
            _guarded(AutoConfig.from_pretrained, settings.model)(model_path), settings.yarn_factor
        )
    import torch

    # Evaluation has the GPU to itself, and vLLM's CUDA graphs pay off over a whole benchmark.
    on_gpu = torch.cuda.is_available()
    spec = EngineSpec(
        settings.backend,
        model_path,
        settings.dtype,
        seed=settings.seed,
        config_overrides=overrides or None,
        max_model_len=max_model_len,
        enforce_eager=not on_gpu,
        gpu_memory_utilization=0.85,
        log_file=str(Path(settings.output_dir) / "logs" / "vllm.log"),
    )
    return _guarded(build_engine, settings.model)(spec, tokenizer)


def _guarded(load: Callable, name: str) -> Callable:
    """`load`, with its errors as one-line ModelLoadErrors naming the model."""

    def call(*args, **kwargs):
        try:
            return load(*args, **kwargs)
        except ModelLoadError:
            raise  # the shared loader already named the model in one line
        except (OSError, ValueError, TypeError) as err:
            lines = [line for line in str(err).splitlines() if line.strip() and "validation error" not in line]
            raise ModelLoadError(
                f"model {name}: cannot load ({lines[0].strip() if lines else type(err).__name__})"
            ) from None

    return call


def loaded_rope(engine) -> dict[str, Any] | None:
    """The rope settings of the model the engine runs (hf: its model's config)."""
    return model_rope(engine.model.config if hasattr(engine, "model") else engine.hf_config)


# ---- the run -----------------------------------------------------------------------------------


def check_inputs(settings: EvalSettings) -> None:
    """Everything that can be checked in a second, checked before the model loads."""
    check_model_source(settings.model, "--model")
    for spec in settings.data:
        check_data_path(spec, "--data")
    load_reward_function(settings.reward)  # a bad spec fails here, with the registry's message


def open_tracker(settings: EvalSettings) -> MlflowTracker:
    """A new MLflow run in settings.experiment; by default a sqlite store under output_dir."""
    output_dir = Path(settings.output_dir)
    return MlflowTracker(
        settings.tracking_uri or default_tracking_uri(output_dir),
        settings.experiment,
        None,
        artifact_root=output_dir / "mlartifacts" if settings.tracking_uri is None else None,
    )


def settings_params(settings: EvalSettings) -> dict[str, Any]:
    """The MLflow params of a run: the settings that shape its numbers, and the files as a list."""
    params = {
        k: v for k, v in asdict(settings).items() if k not in ("data", "output_dir", "tracking_uri", "experiment")
    }
    params["files"] = list(settings.data)
    return params


def read_prompts(settings: EvalSettings, tokenizer, log: Callable[[str], None]) -> list[EvalPrompt]:
    prompts: list[EvalPrompt] = []
    for spec in settings.data:
        rows, skipped = load_rows(spec)
        rows = rows[: settings.limit] if settings.limit else rows
        # No length limit: a benchmark's prompts are never dropped (the engine refuses what it cannot hold).
        prompt_set = tokenize_prompts(rows, tokenizer, sys.maxsize, settings.apply_chat_template)
        names = [source_name(p.fields, spec) for p in prompt_set.prompts]
        prompts += [EvalPrompt(name, p) for name, p in zip(names, prompt_set.prompts)]
        note = f", {skipped} unusable rows skipped" if skipped else ""
        log(f"{spec}: {len(prompt_set.prompts)} prompts ({', '.join(dict.fromkeys(names))}){note}")
    return prompts


def generate(engine, prompts: list[EvalPrompt], settings: EvalSettings) -> list[list[Completion]]:
    """K completions per prompt, in prompt order; hf in batches of settings.batch_size prompts."""
    step = len(prompts) if settings.backend == "vllm" else settings.batch_size
    completions: list[list[Completion]] = []
    for start in range(0, len(prompts), step):
        sampling = SamplingSettings(
            samples_per_prompt=settings.n,
            max_new_tokens=settings.max_tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            seed=settings.seed + start,  # another stream per batch
        )
        completions += engine.generate([p.prompt.token_ids for p in prompts[start : start + step]], sampling)
    return completions


def score(
    prompts: list[EvalPrompt], completions: list[list[Completion]], settings: EvalSettings
) -> list[list[float | None]]:
    """[P][K] reward scores, None where the reward could not score the sample."""
    rows = [
        ScoringRow(c.text, p.prompt.answer, p.prompt.text, p.prompt.fields)
        for p, samples in zip(prompts, completions)
        for c in samples
    ]
    with RowScorer([(settings.reward, {})], timeout_s=settings.reward_timeout_s) as scorer:
        [(flat, _)] = scorer.score(
            [r.completion for r in rows], [r.prompt for r in rows], [r.answer for r in rows], row_fields_of(rows)
        )
    k = settings.n
    return [flat[i * k : (i + 1) * k] for i in range(len(prompts))]


def write_samples(path: Path, prompts: list[EvalPrompt], completions, scores) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for p, samples, sample_scores in zip(prompts, completions, scores):
            for index, (c, s) in enumerate(zip(samples, sample_scores)):
                record = {
                    "data_source": p.source,
                    "prompt": p.prompt.text,
                    "answer": p.prompt.answer,
                    "sample": index,
                    "completion": c.text,
                    "score": s,
                    "finish_reason": c.finish_reason,
                }
                out.write(json.dumps(record, ensure_ascii=False) + "\n")


def evaluate(settings: EvalSettings, log: Callable[[str], None] = print) -> EvalReport:
    """Sample, score, write samples.jsonl, log one MLflow run; see the module docstring."""
    check_inputs(settings)
    timings: dict[str, float] = {}
    tokenizer = load_tokenizer(settings.model)
    prompts = read_prompts(settings, tokenizer, log)
    output_dir = Path(settings.output_dir)
    tracker = open_tracker(settings)
    params = settings_params(settings)
    tracker.log_config(params, {**params, "output_dir": settings.output_dir})
    with tracker.ending():
        started = time.perf_counter()
        longest = max(len(p.prompt.token_ids) for p in prompts)
        engine = load_engine(settings, tokenizer, max_model_len=longest + settings.max_tokens)
        rope = loaded_rope(engine)
        if settings.yarn_factor is not None:
            tracker.client.log_param(tracker.run_id, "rope_parameters", json.dumps(rope))
        timings["timing/load"] = time.perf_counter() - started
        log(
            f"sampling {len(prompts)} prompts x {settings.n} with {settings.backend} (max {settings.max_tokens} tokens)"
        )
        t = time.perf_counter()
        try:
            completions = generate(engine, prompts, settings)
        finally:  # not at the interpreter's exit, where vLLM's output handler printed EngineDeadError
            engine.shutdown()
        timings["timing/generate"] = time.perf_counter() - t
        tokens = sum(len(c.token_ids) for samples in completions for c in samples)
        timings["throughput/completion_tokens_per_s"] = tokens / max(timings["timing/generate"], 1e-9)
        t = time.perf_counter()
        scores = score(prompts, completions, settings)
        timings["timing/reward"] = time.perf_counter() - t
        sources = summarize(
            [p.source for p in prompts],
            scores,
            [[c.finish_reason == "length" for c in samples] for samples in completions],
        )
        samples_file = output_dir / "samples.jsonl"
        write_samples(samples_file, prompts, completions, scores)
        metrics = {**_source_metrics(sources, settings.n), **timings}
        tracker.log_metrics(0, metrics)
        tracker.client.log_artifact(tracker.run_id, str(samples_file))
    return EvalReport(settings.n, sources, samples_file, tracker.run_id, tracker.tracking_uri, metrics, rope)


def _source_metrics(sources: list[SourceResult], k: int) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for s in sources:
        metrics[metric_key(s.source, f"avg_at_{k}")] = s.avg_at_k
        metrics[metric_key(s.source, f"pass_at_{k}")] = s.pass_at_k
        metrics[metric_key(s.source, "failures")] = float(s.failures)
        metrics[metric_key(s.source, "truncated_fraction")] = s.truncated
    return metrics
