"""`grpo-ray`: train and validate GRPO recipes, check rewards, evaluate models.

    grpo-ray validate configs/tiny.yaml
    grpo-ray train configs/tiny.yaml --set train.steps=20 --set output_dir=runs/try
    grpo-ray rewards score --config configs/tiny.yaml --data answers.jsonl --output scored.jsonl
    grpo-ray eval --model tiny --data tiny:heldout --temperature 0 --max-tokens 4 --reward exact_match
    grpo-ray sweep-temperature --model tiny --data tiny:heldout --temperatures 0.6,1.0,1.4 --n 8
    grpo-ray polaris drop-easy --ledger ledger.jsonl --data train.parquet --output stage2.jsonl
    grpo-ray runs compare runs/try runs/other --plot curves.png

Every user-facing error ends the command with one line naming the field or file and what to do,
and exit code 1 (130 on Ctrl-C); a local Ray started here is stopped in every case.
"""

from __future__ import annotations

import os

# Before torch is imported anywhere in this process (see ACTOR_ENV in cluster/session.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from functools import wraps  # noqa: E402

import click  # noqa: E402

from grpo_ray.errors import first_line  # noqa: E402
from grpo_ray.config import (  # noqa: E402
    ConfigError,
    load_config,
)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exception types whose message is meant for the user as is (one line, names the thing)."""
    from grpo_ray.training.checkpoint import CheckpointError
    from grpo_ray.cluster.placement import ClusterError
    from grpo_ray.cluster.weight_broadcast import WeightSyncError
    from grpo_ray.data.loaders import DataError
    from grpo_ray.models.loading import ModelLoadError
    from grpo_ray.rewards import RewardSpecError
    from grpo_ray.training.errors import RunStoppedError
    from grpo_ray.envs.runner_child import EnvironmentSpecError

    return (
        ConfigError,
        CheckpointError,
        ClusterError,
        WeightSyncError,
        DataError,
        ModelLoadError,
        RewardSpecError,
        RunStoppedError,
        EnvironmentSpecError,
    )


def one_line_errors(command: Callable) -> Callable:
    @wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ConfigError as err:  # every wrong field of the recipe, one line each
            for line in err.lines[:-1]:
                click.echo(f"error: {line}", err=True)
            _fail(err.lines[-1])
        except KeyboardInterrupt:
            click.echo("interrupted; Ray processes stopped", err=True)
            sys.exit(130)
        except Exception as err:
            if isinstance(err, _user_errors()):
                _fail(str(err))
            raise

    return wrapper


def _fail(message: str) -> None:
    click.echo(f"error: {first_line(message) or 'unknown error'}", err=True)
    sys.exit(1)


@click.group()
@click.version_option(package_name="grpo-ray")
def main() -> None:
    """GRPO training of language models on Ray."""


OVERRIDES = click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config field, e.g. --set train.steps=10"
)


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@OVERRIDES
@click.option(
    "--address", default=None, help="Check the plan against this running Ray cluster (default: RAY_ADDRESS if set)."
)
@click.option(
    "--gpu-memory-gb",
    default=80.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Memory of one GPU in GiB: the memory plan warns when a role needs more.",
)
@click.option(
    "--plan-only",
    is_flag=True,
    help="Print the plan without checking models, rewards, data and resources here (a recipe for another machine).",
)
@click.option("--verbose", is_flag=True, help="Print the resolved config (every field, defaults included) first.")
@one_line_errors
def validate(
    config: str, overrides: tuple[str, ...], address: str | None, gpu_memory_gb: float, plan_only: bool, verbose: bool
) -> None:
    """Check what a run of the recipe needs, as `train` does before it starts anything: models and
    tokenizers resolve, reward functions import (in the reward sandbox), data files exist and map to
    prompts and answers, and the plan fits this machine or the cluster (--address, ray.address,
    RAY_ADDRESS). Prints each role's resources, the batch arithmetic, the memory plan per GPU and
    the learning rate (--verbose: the resolved config first), then `ok`, or one line per problem
    found (all of them) and exit 1."""
    from grpo_ray.commands.validate import checked_line, first_prompt_lines, plan_report

    cfg = load_config(config, overrides)
    if not plan_only:  # a recipe that cannot run here at all, before its plan
        from grpo_ray.training.preflight import check_quantization

        check_quantization(cfg)
    lines, warnings = plan_report(cfg, gpu_memory_gb, with_config=verbose)
    for line in lines:
        click.echo(line)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    if plan_only:
        click.echo("plan only: models, rewards, data and resources not checked (--plan-only)")
        return
    from grpo_ray.quiet import quiet_driver
    from grpo_ray.training.preflight import preflight

    quiet_driver()
    checked = preflight(cfg, address)
    for line in first_prompt_lines(checked.inputs.train_prompts[:1], checked.inputs.first_prompt_shown):
        click.echo(line)
    click.echo(
        "\n" + checked_line(cfg, len(checked.inputs.train_prompts), len(checked.inputs.eval_prompts), checked.where)
    )
    click.echo("ok")


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@OVERRIDES
@click.option(
    "--resume/--no-resume",
    "resume",
    default=None,
    help="--resume: continue from the newest checkpoint in output_dir (an error if there is none); "
    "--no-resume: start over, moving old checkpoints aside. Default: resume when a checkpoint exists.",
)
@click.option(
    "--verbose",
    is_flag=True,
    help="Show the libraries' routine notices too (Ray, MLflow, Hugging Face, DeepSpeed), in every actor.",
)
@one_line_errors
def train(config: str, overrides: tuple[str, ...], resume: bool | None, verbose: bool) -> None:
    """Train with a recipe: on RAY_ADDRESS's cluster if set, else on a local Ray started here.

    A run whose output_dir already holds a checkpoint continues from it, so a retried Ray job goes on."""
    cfg = load_config(config, overrides)
    from grpo_ray.quiet import quiet_driver, set_verbose

    set_verbose(verbose)
    quiet_driver()
    from grpo_ray.training import interrupts
    from grpo_ray.training.loop import train as run_training

    interrupts.install()

    from grpo_ray.training.startup import process_start

    click.echo(f"grpo-ray: training {config}")
    resume_mode = {None: "auto", True: "require", False: "never"}[resume]
    result = run_training(cfg, resume=resume_mode, launched=process_start())
    click.echo(f"MLflow run {result.run_id}: {result.tracking_uri}")


@main.group()
def rewards() -> None:
    """Check reward functions on your own data."""


@rewards.command("score")
@click.option(
    "--config", "config", required=True, type=click.Path(dir_okay=False), help="Recipe whose reward section to use."
)
@click.option(
    "--data", "data", required=True, type=click.Path(dir_okay=False), help="JSON lines with completion and answer."
)
@click.option(
    "--output", "output", type=click.Path(dir_okay=False), help="Write each row with its scores here (JSON lines)."
)
@OVERRIDES
@one_line_errors
def rewards_score(config: str, data: str, output: str | None, overrides: tuple[str, ...]) -> None:
    """Score existing completions with the recipe's reward functions; print mean and failures per function."""
    from grpo_ray.commands.rewards_score import score_file, summary_lines

    report = score_file(config, data, output, overrides)
    for line in summary_lines(report):
        click.echo(line)
    if output is not None:
        click.echo(f"wrote {output}")


REWARD_SPECS, DTYPES = "a built-in name, module:function or file.py:function.", ["float32", "bfloat16", "float16"]
# The options eval and sweep-temperature share, in this order after their own.
SAMPLING_OPTIONS = (
    click.option("--max-tokens", default=1024, show_default=True, type=int, help="Longest completion in tokens."),
    click.option("--top-p", default=1.0, show_default=True, type=float),
    click.option("--backend", default="hf", show_default=True, type=click.Choice(["hf", "vllm"])),
    click.option("--reward", default="math", show_default=True, help="Reward spec: " + REWARD_SPECS),
    click.option("--limit", default=None, type=int, help="Use only the first N prompts of each file."),
    click.option("--dtype", default="float32", show_default=True, type=click.Choice(DTYPES)),
    click.option("--seed", default=0, show_default=True, type=int),
    click.option("--tracking-uri", default=None, help="MLflow tracking URI; default: sqlite under --output-dir."),
)
MODEL_HELP = "Hub id, local folder, or a built-in: tiny, tiny-tools, tiny-teacher, smollm2-135m, gemma3-270m."
DATA_HELP = "file (parquet, jsonl, ...), hub id, or a built-in task (tiny:heldout, smollm2-135m:heldout); repeatable."


def sampling_options(command: Callable) -> Callable:
    for option in reversed(SAMPLING_OPTIONS):
        command = option(command)
    return command


@main.command("eval")
@click.option(
    "--config",
    type=click.Path(dir_okay=False),
    help="A recipe: evaluate as its run does, on its held-out prompts with its sampling, rewards and environment "
    "(each sample an episode); the options given set its fields (--model: model.path, --n: train.eval_samples, ...).",
)
@click.option("--model", help=MODEL_HELP)
@click.option("--data", "data", multiple=True, help="Benchmark " + DATA_HELP)
@click.option("--n", "n", default=1, show_default=True, type=int, help="Samples per prompt (k of avg@k and pass@k).")
@click.option(
    "--temperature", default=1.0, show_default=True, type=float, help="Sampling temperature; 0 is greedy (with --n 1)."
)
@sampling_options
@click.option("--yarn-factor", default=None, type=float, help="Evaluate with YaRN rope scaling by this factor.")
@click.option("--output-dir", default="runs/eval", show_default=True, type=click.Path(file_okay=False))
@OVERRIDES
@one_line_errors
def eval_command(config: str | None, overrides: tuple[str, ...], **options) -> None:
    """Sample completions on benchmark files and report avg@k and pass@k per data source; or, with
    --config, a recipe's held-out accuracy and episode figures as its run measures them."""
    from grpo_ray.commands.evaluate import EvalSettings, evaluate
    from grpo_ray.quiet import quiet_driver

    if config is not None:  # commands/evaluate_recipe.py: the options typed set the recipe's fields
        from grpo_ray.commands.evaluate_recipe import run_recipe_eval

        source = click.get_current_context().get_parameter_source
        given = {name: v for name, v in options.items() if source(name).name not in ("DEFAULT", "DEFAULT_MAP")}
        return run_recipe_eval(config, overrides, given, options["output_dir"], options["tracking_uri"], click.echo)
    if overrides or not options["model"] or not options["data"]:
        raise ConfigError("--model and --data: give both, or a recipe with --config (and its fields with --set)")
    quiet_driver()
    report = evaluate(EvalSettings(**options), log=click.echo)
    for line in report.table_lines():
        click.echo(line)
    click.echo(f"samples: {report.samples_file}")
    click.echo(f"MLflow run {report.run_id}: {report.tracking_uri}")


@main.command("sweep-temperature")
@click.option("--model", required=True, help=MODEL_HELP)
@click.option("--data", "data", required=True, multiple=True, help="Prompt " + DATA_HELP)
@click.option("--temperatures", required=True, help="Comma-separated temperatures > 0, e.g. 0.6,1.0,1.4.")
@click.option("--n", "n", default=8, show_default=True, type=int, help="Samples per prompt at each temperature.")
@sampling_options
@click.option("--output-dir", default="runs/sweep-temperature", show_default=True, type=click.Path(file_okay=False))
@one_line_errors
def sweep_temperature_command(temperatures: str, **options) -> None:
    """Report accuracy (avg@n) and diversity at each temperature, to pick the rollout temperature (POLARIS)."""
    from grpo_ray.commands.evaluate import EvalSettings
    from grpo_ray.commands.temperature_sweep import parse_temperatures, sweep_temperatures
    from grpo_ray.quiet import quiet_driver

    quiet_driver()

    chosen = parse_temperatures(temperatures)
    settings = EvalSettings(temperature=chosen[0], experiment="grpo-ray-sweep-temperature", **options)
    report = sweep_temperatures(settings, chosen, log=click.echo)
    for line in report.table_lines():
        click.echo(line)
    click.echo(f"sweep: {report.sweep_file}")
    click.echo(f"MLflow run {report.run_id}: {report.tracking_uri}")


@main.group()
def polaris() -> None:
    """POLARIS recipe steps between training stages."""


@polaris.command("drop-easy")
@click.option("--ledger", required=True, help="Prompt ledger the training run saved (JSON lines uid, sum, count).")
@click.option(
    "--data", "data", required=True, multiple=True, help="The run's data.train_files, in the same order; repeatable."
)
@click.option(
    "--output", required=True, type=click.Path(dir_okay=False), help="Write the records kept here (JSON lines)."
)
@click.option(
    "--threshold", default=0.9, show_default=True, type=float, help="Drop prompts whose average reward is above this."
)
@one_line_errors
def polaris_drop_easy(ledger: str, data: tuple[str, ...], output: str, threshold: float) -> None:
    """Write the training records whose average reward was not above --threshold: the next stage's data."""
    from grpo_ray.commands.drop_easy import drop_easy_records

    report = drop_easy_records(ledger, data, output, threshold)
    click.echo(report.summary_line(threshold))


@main.group()
def runs() -> None:
    """Look at training runs logged to MLflow."""


@runs.command("compare")
@click.argument("targets", nargs=-1, metavar="[RUN_DIR... | RUN_ID...]")
@click.option("--experiment", default=None, help="Compare every top-level run of this experiment in --tracking-uri.")
@click.option(
    "--tracking-uri",
    envvar="MLFLOW_TRACKING_URI",
    default=None,
    help="MLflow store of the RUN_IDs or --experiment, e.g. sqlite:////abs/runs/try/mlflow.db or http://mlflow:5000; "
    "default: $MLFLOW_TRACKING_URI. Not with RUN_DIRs.",
)
@click.option(
    "--metric",
    "metrics",
    multiple=True,
    metavar="KEY",
    help="Metric rows to show instead of reward/mean, eval/accuracy, loss/total, timing/step; repeatable.",
)
@click.option(
    "--plot",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write reward/mean and eval/accuracy curves to this PNG.",
)
@one_line_errors
def runs_compare(
    targets: tuple[str, ...],
    experiment: str | None,
    tracking_uri: str | None,
    metrics: tuple[str, ...],
    plot: str | None,
) -> None:
    """Compare training runs side by side: run folders, run ids of one store, or an experiment.

    \b
        grpo-ray runs compare runs/a runs/b
        grpo-ray runs compare RUN_ID RUN_ID --tracking-uri sqlite:////abs/runs/try/mlflow.db
        grpo-ray runs compare --experiment grpo-ray --tracking-uri http://mlflow:5000

    A RUN_DIR is a run's output_dir, read from its own mlflow.db; where it holds several top-level runs
    (the same output_dir trained again) its newest is compared and a line says so. Rows: the params
    that differ, values whole; the last and best value of each main metric (best is the min for loss-
    and timing-like keys, the max otherwise); status and duration.
    """
    from click.core import ParameterSource

    from grpo_ray.commands import runs_compare as compare

    typed = click.get_current_context().get_parameter_source("tracking_uri") is ParameterSource.COMMANDLINE
    try:
        keys = metrics or compare.DEFAULT_METRICS
        if plot is not None:
            compare.check_plot_path(plot)
        wanted = [*keys, *(compare.PLOT_METRICS if plot else ())]
        found, notes = compare.load_compared(targets, experiment, tracking_uri, wanted, typed)
        for line in [*notes, *compare.table_lines(found, keys)]:
            click.echo(line)
        if plot is not None:
            compare.plot_curves(found, plot)
            click.echo(f"wrote {plot}")
    except compare.RunsCompareError as err:
        _fail(str(err))


if __name__ == "__main__":
    main()
