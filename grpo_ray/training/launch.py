"""A run's start, from its quick checks passed to its actors up: what happens in which order.

Starting a local Ray (this machine): the start used one core of two until Ray was up, so the slow
checks (the reward functions and the environment imported in their own processes, the prompts
tokenized) run in a thread while Ray starts, and the MLflow run opens while the actors build in
their processes (hf 19.1 -> 13.1 s to the first step on 2 cores, benchmarks/startup.py).

Joining a cluster (ray.address, or RAY_ADDRESS as under `ray job submit`): one after the other, as
before, checks, MLflow, Ray, actors. There is no local start to overlap, and under `ray job submit`
this process's working directory is the job's, which Ray manages: once the driver had connected it
was gone (FileNotFoundError from os.getcwd, in transformers' import and in MLflow's store), so
whatever reads it comes first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import NamedTuple

from grpo_ray.cluster.roles import Workers, start_workers, wait_started
from grpo_ray.cluster.session import joins_cluster, ray_session, ray_session_beside
from grpo_ray.config import Config, plan_batches
from grpo_ray.tracking import ConsoleReporter, MlflowTracker
from grpo_ray.training.checkpoint import TrainerState
from grpo_ray.training.inputs import RunInputs
from grpo_ray.training.opening import open_tracker, report_inputs, report_session
from grpo_ray.training.startup import StartupClock


class Started(NamedTuple):
    inputs: RunInputs
    tracker: MlflowTracker  # its run ends (FINISHED, FAILED or KILLED) as the `started` context closes
    workers: Workers


@contextlib.contextmanager
def started(
    cfg: Config,
    slow_checks: Callable[[], RunInputs],
    state: TrainerState | None,
    resume_from: Path | None,
    console: ConsoleReporter,
    clock: StartupClock,
) -> Iterator[Started]:
    """The run's inputs, MLflow run and actors (constructors finished, learners joined) in its Ray
    session, each start phase marked on `clock`; the MLflow run is ended and a local Ray stopped
    (a cluster left) on the way out."""
    if joins_cluster(cfg.ray):
        inputs = slow_checks()
        clock.mark("data")
        tracker = open_tracker(cfg, state, console)
        clock.mark("mlflow")
        report_inputs(inputs, resume_from, state, console)
        with tracker.ending(), ray_session(cfg.ray, console.info) as session:
            clock.mark("ray")
            report_session(session, console)
            workers = start_workers(cfg, plan_batches(cfg))
            wait_started(workers)
            clock.mark("actors")
            yield Started(inputs, tracker, workers)
        return
    with ray_session_beside(cfg.ray, slow_checks, console.info, partial(clock.mark, "ray")) as (session, inputs):
        clock.mark("data")  # the rest of the slow checks
        report_session(session, console)
        # The actors build in their own processes while this one opens the MLflow run.
        workers = start_workers(cfg, plan_batches(cfg))
        tracker = open_tracker(cfg, state, console)
        clock.mark("mlflow")
        report_inputs(inputs, resume_from, state, console)
        with tracker.ending():
            wait_started(workers)
            clock.mark("actors")
            yield Started(inputs, tracker, workers)
