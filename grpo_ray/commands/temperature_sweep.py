"""Pick a rollout temperature: `grpo-ray sweep-temperature`, in this process, no Ray.

    grpo-ray sweep-temperature --model Qwen/Qwen3-4B --backend vllm --dtype bfloat16 \\
        --data polaris-train.parquet --limit 200 --n 8 --temperatures 1.0,1.2,1.4

POLARIS chooses the sampling temperature before training by looking at two figures together:
accuracy falls and diversity rises as the temperature goes up, and the recipe wants the highest
temperature at which the model still solves a fair share of prompts (samples that all agree teach
GRPO nothing). For each temperature this samples n completions per prompt and reports

    accuracy    avg@n, as `grpo-ray eval` defines it: mean over prompts of the mean score of its
                n samples (a sample the reward could not score counts as 0 and as a failure);
    diversity   mean over prompts of the distinct-4-gram ratio of its n completions, in
                whitespace words (`algo.diversity.group_diversity`); a prompt whose completions
                hold no 4-gram at all is left out, as group_diversity does;
    mean length completion tokens, mean over all samples;
    truncated   fraction of samples that hit --max-tokens (a long-tailed temperature shows here).

The model is loaded once and reused for every temperature, and each temperature samples with
the same seed, so the temperatures are compared on the same random stream. The prompts, engines
and reward scoring are those of `grpo_ray.commands.evaluate`. `sweep.jsonl` under --output-dir gets one
line per temperature as soon as it is done; one MLflow run holds the settings (the temperatures
as a list param) and `sweep/<figure>` metrics at step = the temperature's index in the list.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from grpo_ray.algo.diversity import group_diversity
from grpo_ray.config import ConfigError
from grpo_ray.commands.evaluate import (
    EvalSettings,
    check_inputs,
    generate,
    load_engine,
    open_tracker,
    read_prompts,
    score,
    settings_params,
    summarize,
)
from grpo_ray.models.loading import load_tokenizer
from grpo_ray.types import Completion

DIVERSITY_NGRAM = 4  # distinct-4-grams, as POLARIS reports


@dataclass(frozen=True)
class TemperatureResult:
    """The figures of one temperature; one line of the table and of sweep.jsonl."""

    temperature: float
    accuracy: float  # avg@n
    diversity: float  # mean over prompts of the distinct-4-gram ratio of its n completions
    mean_length: float  # completion tokens, mean over all samples
    truncated: float  # fraction of samples that hit max_tokens
    failures: int  # samples the reward could not score (counted as 0 in accuracy)

    def metrics(self) -> dict[str, float]:
        """As logged to MLflow at this temperature's step."""
        return {f"sweep/{name}": float(value) for name, value in asdict(self).items()}


@dataclass(frozen=True)
class SweepReport:
    n: int  # samples per prompt
    prompts: int
    results: list[TemperatureResult]  # in the order the temperatures were given
    sweep_file: Path
    run_id: str
    tracking_uri: str

    def table_lines(self) -> list[str]:
        n = self.n
        lines = [f"{'temperature':>11}  {f'avg@{n}':>8}  {'diversity':>9}  {'mean length':>11}  {'truncated':>9}"]
        for r in self.results:
            lines.append(
                f"{r.temperature!s:>11}  {r.accuracy:>8.4f}  {r.diversity:>9.4f}  {r.mean_length:>11.1f}  "
                f"{r.truncated:>9.1%}"
            )
        return lines


# ---- pure pieces -------------------------------------------------------------------------------


def parse_temperatures(text: str) -> tuple[float, ...]:
    """'0.6,1.0,1.4' -> (0.6, 1.0, 1.4); a one-line ConfigError naming --temperatures otherwise.

    Each must be a finite number > 0: greedy decoding makes the n samples identical, so there is
    no diversity to measure. A temperature listed twice would only repeat the same samples (same
    seed), so it is refused too.
    """
    example = "give comma-separated temperatures > 0, e.g. 0.6,1.0,1.4"
    if not text.strip():
        raise ConfigError(f"--temperatures: empty; {example}")
    temperatures: list[float] = []
    for item in (part.strip() for part in text.split(",")):
        try:
            value = float(item)
        except ValueError:
            raise ConfigError(f"--temperatures {text}: {item!r} is not a number; {example}") from None
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(
                f"--temperatures {text}: {item} must be a finite number > 0 (greedy samples are identical, so "
                "diversity means nothing)"
            )
        if value in temperatures:
            raise ConfigError(f"--temperatures {text}: {item} is listed twice; each temperature is sampled once")
        temperatures.append(value)
    return tuple(temperatures)


def summarize_temperature(
    temperature: float, scores: list[list[float | None]], completions: list[list[Completion]]
) -> TemperatureResult:
    """The figures of one temperature. scores [P][n] (None: could not score), completions [P][n]."""
    # avg@n and the truncated fraction over all prompts: eval's per-source summary, with one source.
    [overall] = summarize(
        ["all"] * len(scores), scores, [[c.finish_reason == "length" for c in samples] for samples in completions]
    )
    texts = [c.text for samples in completions for c in samples]
    prompt_of_text = [prompt for prompt, samples in enumerate(completions) for _ in samples]
    lengths = [len(c.token_ids) for samples in completions for c in samples]
    return TemperatureResult(
        temperature=temperature,
        accuracy=overall.avg_at_k,
        diversity=group_diversity(texts, prompt_of_text, n=DIVERSITY_NGRAM),
        mean_length=sum(lengths) / len(lengths),
        truncated=overall.truncated,
        failures=overall.failures,
    )


# ---- the run -----------------------------------------------------------------------------------


def sweep_temperatures(
    settings: EvalSettings, temperatures: tuple[float, ...], log: Callable[[str], None] = print
) -> SweepReport:
    """Sample and score at each temperature with one loaded engine; see the module docstring.

    settings.temperature is ignored: each pass runs with one of `temperatures`.
    """
    check_inputs(settings)
    tokenizer = load_tokenizer(settings.model)
    prompts = read_prompts(settings, tokenizer, log)
    output_dir = Path(settings.output_dir)
    tracker = open_tracker(settings)
    params = settings_params(settings)
    del params["temperature"]
    params["temperatures"] = list(temperatures)
    tracker.log_config(params, {**params, "output_dir": settings.output_dir})
    sweep_file = output_dir / "sweep.jsonl"
    results: list[TemperatureResult] = []
    with tracker.ending():
        longest = max(len(p.prompt.token_ids) for p in prompts)
        engine = load_engine(settings, tokenizer, max_model_len=longest + settings.max_tokens)
        sweep_file.parent.mkdir(parents=True, exist_ok=True)
        with sweep_file.open("w", encoding="utf-8") as out:
            for step, temperature in enumerate(temperatures):
                log(
                    f"temperature {temperature}: sampling {len(prompts)} prompts x {settings.n} (max "
                    f"{settings.max_tokens} tokens)"
                )
                at_temperature = replace(settings, temperature=temperature)
                started = time.perf_counter()
                completions = generate(engine, prompts, at_temperature)
                generated = time.perf_counter()
                result = summarize_temperature(temperature, score(prompts, completions, at_temperature), completions)
                timings = {"timing/generate": generated - started, "timing/reward": time.perf_counter() - generated}
                tracker.log_metrics(step, {**result.metrics(), **timings})
                # One line per finished temperature, so a sweep cut short keeps what it measured.
                out.write(json.dumps(asdict(result)) + "\n")
                out.flush()
                results.append(result)
        tracker.client.log_artifact(tracker.run_id, str(sweep_file))
    return SweepReport(settings.n, len(prompts), results, sweep_file, tracker.run_id, tracker.tracking_uri)
