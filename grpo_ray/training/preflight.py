"""What a run needs, checked before any actor starts or any MLflow run is opened: `grpo-ray validate`
and `grpo-ray train` run the same checks, every one of them, and then name every problem found,
one line each naming the field and the fix (a user fixes them all in one go, not one per try).

The quick ones first, then the slow ones (which train runs while its local Ray starts, and which
stop that Ray when they find a problem: checks_beside_ray):

1. model.quantization can run where the learners run (bitsandbytes' backend),
   rollout.vllm.engine_args are options of the installed vLLM, and a teacher scored by vLLM (a
   url teacher's server, or backend: vllm) is asked at the temperature it scores at, 1;
2. every model and tokenizer resolves: a local folder exists, a hub id is in the local Hugging Face
   cache or answers on the hub (one short request: offline, a one-line error at once rather than
   transformers' retries); every data file exists;
3. the plan fits: the cluster at ray.address, RAY_ADDRESS or --address (which must answer within
   seconds: cluster/address.py), or else this machine, where `train` starts a local Ray of its CPUs
   and GPUs;
4. (slow) every reward function imports and takes its options, in the reward sandbox (user code
   never runs in the driver), and the environment class (environment.spec) loads and builds in one
   of its own processes;
5. (slow) the data files' rows map to a prompt and an answer, and the prompts fit
   data.max_prompt_tokens (training/inputs.py: the run's prompts, tokenised once here).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from grpo_ray.cluster.fit import NodeView, nccl_conflicts, plan_bundles, shortfalls
from grpo_ray.config import Config, ConfigError, plan_resources, plan_stages
from grpo_ray.config.vllm_args import check_engine_options
from grpo_ray.models.hub import check_model_source
from grpo_ray.quiet import quiet_vllm_import
from grpo_ray.training.inputs import RunInputs, check_data_paths, read_data_files, tokenized_inputs

# A reward child imports the user's file and the platform's rewards (math-verify): seconds, not minutes.
REWARD_IMPORT_TIMEOUT_S = 120.0


class PlanFitError(ConfigError):
    """The plan asks for more than the cluster or this machine has; one line per shortfall."""


class PreflightError(ConfigError):
    """Several problems found at once: `lines`, one per problem; `errors`, the exceptions themselves."""

    def __init__(self, errors: list[Exception]):
        lines = tuple(dict.fromkeys(line for err in errors for line in getattr(err, "lines", (str(err),))))
        super().__init__(f"{lines[0]} (and {len(lines) - 1} more)" if len(lines) > 1 else lines[0], lines)
        self.errors = errors


@dataclass(frozen=True)
class Preflight:
    inputs: RunInputs  # the run's prompts, tokenised
    where: str  # what the plan was checked against: "this machine (2 CPUs, 0 GPUs)", "the cluster at ..."


def preflight(cfg: Config, address: str | None = None, connect: bool = True) -> Preflight:
    """Every check above; raises the user error when one problem was found, PreflightError with every
    one when several were. address: a cluster to check the plan against (default: ray.address, then
    RAY_ADDRESS; none: this machine). connect=False (train): a cluster is only asked whether it
    answers; its plan is left to reserve(), which asks the same of the cluster once the run has
    joined it; a second connection from inside a Ray job would drop the job's working dir (Ray
    frees a job's runtime environment when its last driver disconnects)."""
    found = _Problems()
    quick = _quick_checks(found, cfg, address, connect)
    inputs = _slow_checks(found, cfg, quick)
    found.raise_them()
    return Preflight(inputs, quick.where)


def checks_beside_ray(cfg: Config) -> Callable[[], RunInputs]:
    """train's preflight, in two parts: the quick checks now, and the slow ones (4 and 5: the reward
    functions and the environment imported in processes of their own, the prompts tokenised)
    returned, for train to run while its local Ray starts (Ray's start mostly waits on its own
    processes; 2 s of the tiny recipe's start on 2 CPUs). A bad input among the quick checks runs
    the slow ones too, at once, and raises every problem, as preflight does: no Ray starts. One
    found by the slow checks stops the Ray that started beside them."""
    found = _Problems()
    quick = _quick_checks(found, cfg, None, connect=False)
    if found.errors:
        _slow_checks(found, cfg, quick)
        found.raise_them()

    def slow_checks() -> RunInputs:
        later = _Problems()
        inputs = _slow_checks(later, cfg, quick)
        later.raise_them()
        return inputs

    return slow_checks


class _QuickChecked(NamedTuple):
    where: str | None  # what the plan was checked against (None: the plan did not fit)
    models_resolve: bool  # every model and tokenizer
    data_found: bool  # every data file exists (a hub dataset answered)


def _quick_checks(found: _Problems, cfg: Config, address: str | None, connect: bool) -> _QuickChecked:
    """1 to 3: the models and the data files resolve, and the plan fits."""
    found.check(check_quantization, cfg)
    found.check(check_vllm_engine_args, cfg)
    found.check(check_teacher_temperatures, cfg)
    for field, source in model_sources(cfg):
        found.check(check_model_source, source, field)
    models_resolve = not found.errors
    errors_before = len(found.errors)
    found.check(check_data_paths, cfg)
    data_found = len(found.errors) == errors_before
    return _QuickChecked(
        found.check(check_plan_fits, cfg, *cluster_address(cfg, address), connect), models_resolve, data_found
    )


def _slow_checks(found: _Problems, cfg: Config, quick: _QuickChecked) -> RunInputs | None:
    """4 and 5: the run's prompts, tokenised. The data paths were checked by the quick checks: not
    again (a hub dataset not cached here would be asked for twice)."""
    found.check(check_reward_functions, cfg)
    found.check(check_environment, cfg)
    if not quick.data_found:
        return None
    # The prompts are tokenised with the model's tokenizer; without one the data files are still read.
    return found.check(tokenized_inputs if quick.models_resolve else read_data_files, cfg)


T = TypeVar("T")


class _Problems:
    """Runs each check, keeping the user errors (one-line messages) of those that fail."""

    def __init__(self) -> None:
        self.errors: list[Exception] = []

    def check(self, check: Callable[..., T], *args: Any) -> T | None:
        from grpo_ray.data.loaders import DataError
        from grpo_ray.envs.runner_child import EnvironmentSpecError
        from grpo_ray.errors import ClusterError, ModelLoadError
        from grpo_ray.rewards.registry import RewardSpecError

        try:
            return check(*args)
        except (ConfigError, ModelLoadError, DataError, RewardSpecError, EnvironmentSpecError, ClusterError) as err:
            self.errors.append(err)
            return None

    def raise_them(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise PreflightError(self.errors)


def cluster_address(cfg: Config, given: str | None) -> tuple[str | None, str]:
    """(the cluster to check the plan against or None for this machine, the setting that named it)."""
    if given:
        return given, "--address"
    if cfg.ray.address:
        return cfg.ray.address, "ray.address"
    return os.environ.get("RAY_ADDRESS") or None, "RAY_ADDRESS"


def check_vllm_engine_args(cfg: Config) -> None:
    """rollout.vllm.engine_args: names this vLLM's engine takes, where vLLM is installed here (on a
    driver without it, the engine checks them as it starts, with the same line)."""
    if cfg.rollout.backend != "vllm" or not cfg.rollout.vllm.engine_args:
        return
    quiet_vllm_import()
    try:
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
    except ImportError:
        return
    try:
        check_engine_options(cfg.rollout.vllm.engine_args, AsyncEngineArgs, vllm.__version__)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_teacher_temperatures(cfg: Config) -> None:
    """Every stage samples at temperature 1 when a teacher is scored by vLLM (a url teacher, or
    backend: vllm): vLLM computes prompt log-probs from the raw logits whatever the request's
    temperature ("prompt tokens skip sampling processors"), so at another temperature the teacher's
    and the student's log-probs would be of different distributions."""
    by_vllm = [(i, t) for i, t in enumerate(cfg.distillation.teachers) if t.served or t.backend == "vllm"]
    if not by_vllm:
        return
    i, teacher = by_vllm[0]
    for index, stage in enumerate(plan_stages(cfg)):
        if stage.temperature != 1:
            where = "rollout.temperature"
            if cfg.stages and cfg.stages[index].temperature is not None:
                where = f"stages.{index}.temperature"
            raise ConfigError(
                f"{where}: {stage.temperature:g}, and teacher {teacher.name} (distillation.teachers.{i}) is scored by "
                "vLLM, whose prompt log-probs are the model's at temperature 1 (it applies no temperature to them); "
                "sample at temperature 1, or run the teacher with model_path and backend: hf"
            )


def check_quantization(cfg: Config) -> None:
    """model.quantization: refuse, in one line and before anything starts, where bitsandbytes cannot run."""
    if cfg.model.quantization is None:
        return
    from grpo_ray.models.quantization import quantization_problem

    problem = quantization_problem(cfg.model.quantization, cfg.learner.num_gpus > 0)
    if problem is not None:
        raise ConfigError(problem)


def model_sources(cfg: Config) -> list[tuple[str, str]]:
    """(field, value) of every model and tokenizer the run loads."""
    named = [
        ("model.path", cfg.model.path),
        ("model.tokenizer", cfg.model.tokenizer),
        ("reference.model_path", cfg.reference.model_path if cfg.use_reference else None),
        ("reference.tokenizer", cfg.reference.tokenizer if cfg.use_reference else None),
        ("reward.model.path", cfg.reward.model.path),
        ("reward.model.tokenizer", cfg.reward.model.tokenizer if cfg.reward.model.path else None),
    ]
    for i, teacher in enumerate(cfg.distillation.teachers):
        named += [
            (f"distillation.teachers.{i}.model_path", teacher.model_path),
            (f"distillation.teachers.{i}.tokenizer", teacher.tokenizer),
        ]
    return [(field, value) for field, value in named if value]


def check_reward_functions(cfg: Config) -> None:
    """Every reward function of the recipe imports and takes its options, in a reward sandbox child
    (the user's file runs there, never in the driver); RewardSpecError names the spec."""
    from grpo_ray.rewards.sandbox import SandboxedScorer

    functions = [(f.name, dict(f.options)) for f in cfg.reward.functions]
    functions += [(f.name, dict(f.options)) for group in cfg.reward.by_source.values() for f in group]
    unique = list({(spec, repr(sorted(options.items()))): (spec, options) for spec, options in functions}.values())
    if not unique:  # a teacher's signal alone (distillation.with_rewards: false): no function to load
        return
    with SandboxedScorer(unique, num_processes=1, start_timeout_s=REWARD_IMPORT_TIMEOUT_S):
        pass


def check_environment(cfg: Config) -> None:
    """The environment class loads and builds with its options, in one of its own processes (user
    code never runs in the driver); EnvironmentSpecError names the spec."""
    env = cfg.environment
    if env.spec is None:
        return
    from grpo_ray.envs.runner import EnvironmentPool

    with EnvironmentPool(env.spec, dict(env.options), processes=1, step_timeout_s=env.step_timeout_s):
        pass


def check_plan_fits(cfg: Config, address: str | None, named_by: str = "--address", connect: bool = True) -> str:
    """What the plan was checked against; PlanFitError with every shortfall, one line each;
    ClusterError when no cluster answers at `address` (connect=False: only that is asked)."""
    roles = plan_resources(cfg)
    bundles, _ = plan_bundles(roles, cfg.placement.colocate)
    if address:
        from grpo_ray.cluster.address import check_cluster_answers
        from grpo_ray.cluster.placement import nodes_at

        check_cluster_answers(address, named_by)
        if not connect:
            return f"the cluster at {address} (at reserve)"

        nodes = nodes_at(address)
        missing = shortfalls(roles, bundles, nodes)
        where = f"the cluster at {address} ({_totals(nodes)})"
        fix = "free or add resources, or lower the recipe's num_workers, num_cpus and num_gpus"
    else:
        cpus, gpus = float(cfg.ray.num_cpus or os.cpu_count() or 1), float(_local_gpus())
        missing = shortfalls(roles, bundles, [NodeView({"CPU": cpus, "GPU": gpus})])
        if gpus:  # NCCL refuses two learner ranks on one GPU; shortfalls counts only the totals
            missing += [line for line in nccl_conflicts(roles, bundles, gpus) if line not in missing]
        where = f"this machine ({cpus:g} CPUs, {gpus:g} GPUs; no ray.address or RAY_ADDRESS: a local Ray)"
        fix = (
            "lower the recipe's num_workers, num_cpus and num_gpus (grpo-ray validate prints them), or set RAY_ADDRESS"
        )
    if missing:
        lines = tuple(f"{line.replace('the cluster has', 'there are')} on {where}; {fix}" for line in missing)
        raise PlanFitError(lines[0] if len(lines) == 1 else f"{lines[0]} (and {len(lines) - 1} more)", lines)
    return where


def _totals(nodes: list[NodeView]) -> str:
    """ "2 nodes: CPU 4, GPU 8, learner_node 1": what the plan's roles can ask for, summed."""
    totals: dict[str, float] = {}
    for node in nodes:
        for name, amount in node.resources.items():
            if not (name.startswith("node:") or name in ("memory", "object_store_memory")):
                totals[name] = totals.get(name, 0.0) + amount
    listed = ", ".join(f"{name} {amount:g}" for name, amount in sorted(totals.items()))
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}: {listed}"


def _local_gpus() -> int:
    """GPUs a local Ray would see here (it counts CUDA devices the same way)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
