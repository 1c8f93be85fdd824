"""`grpo-ray`: train and validate GRPO recipes.

    grpo-ray validate configs/tiny.yaml
    grpo-ray train configs/tiny.yaml --set train.steps=20 --set output_dir=runs/try

Every user-facing error ends the command with one line naming the field or file and what to do,
and exit code 1 (130 on Ctrl-C); a local Ray started here is stopped in every case.
"""

from __future__ import annotations

import os

# Before torch is imported anywhere in this process (see ACTOR_ENV in cluster/session.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import signal  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from functools import wraps  # noqa: E402

import click  # noqa: E402
import yaml  # noqa: E402

from grpo_ray.config import (  # noqa: E402
    ConfigError,
    config_to_dict,
    describe_resources,
    load_config,
    plan_batches,
    plan_resources,
)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exception types whose message is meant for the user as is (one line, names the thing)."""
    from grpo_ray.cluster.actors import ClusterError
    from grpo_ray.cluster.weights import WeightSyncError
    from grpo_ray.data.loaders import DataError
    from grpo_ray.driver import RewardFailureError
    from grpo_ray.models.loading import ModelLoadError
    from grpo_ray.rewards import RewardSpecError

    return (ConfigError, ClusterError, WeightSyncError, DataError, ModelLoadError, RewardSpecError, RewardFailureError)


def one_line_errors(command: Callable) -> Callable:
    @wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ConfigError as err:
            _fail(str(err))
        except KeyboardInterrupt:
            click.echo("interrupted; Ray processes stopped", err=True)
            sys.exit(130)
        except Exception as err:
            if isinstance(err, _user_errors()):
                _fail(str(err))
            raise

    return wrapper


def _fail(message: str) -> None:
    click.echo(f"error: {message.splitlines()[0] if message else 'unknown error'}", err=True)
    sys.exit(1)


def _terminate_as_interrupt(signum, frame) -> None:
    # SIGTERM (ray job stop, kill) unwinds like Ctrl-C, so `finally` blocks stop Ray.
    raise KeyboardInterrupt


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
@one_line_errors
def validate(config: str, overrides: tuple[str, ...]) -> None:
    """Print the resolved config, the resources of each role and the batch arithmetic."""
    cfg = load_config(config, overrides)
    plan = plan_batches(cfg)
    click.echo("# resolved config")
    click.echo(yaml.safe_dump(config_to_dict(cfg), sort_keys=False).rstrip())
    click.echo("\n# resources")
    for line in describe_resources(plan_resources(cfg)):
        click.echo(line)
    click.echo("\n# batch per step")
    click.echo(f"prompts per step               {plan.prompts_per_step}")
    click.echo(f"completions per step           {plan.completions_per_step} ({cfg.rollout.samples_per_prompt} per prompt)")
    click.echo(f"prompts per rollout worker     {plan.prompts_per_rollout_worker}")
    click.echo(f"sequences per learner rank     {plan.sequences_per_learner_rank}")
    click.echo(f"sequences per micro-batch      {plan.micro_batch_size} ({plan.grad_accum_steps} accumulation steps)")
    click.echo(f"reference model                {'yes' if cfg.use_reference else 'no (kl_coef = 0)'}")
    click.echo("ok")


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@OVERRIDES
@one_line_errors
def train(config: str, overrides: tuple[str, ...]) -> None:
    """Train with a recipe: on RAY_ADDRESS's cluster if set, else on a local Ray started here."""
    cfg = load_config(config, overrides)
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    from grpo_ray.driver import train as run_training

    click.echo(f"grpo-ray: training {config}")
    result = run_training(cfg)
    click.echo(f"MLflow run {result.run_id}: {result.tracking_uri}")

if __name__ == "__main__":
    main()
