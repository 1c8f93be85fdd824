"""The files in cluster/ hold to Ray's and KubeRay's field names and to the recipes they run.

Nothing here starts Ray: the YAML is loaded and handed to the validators `ray up`, `ray job submit`
and `ray.init` themselves run (Ray's launcher schema and config checks, `RuntimeEnv`, the job's
exclude matcher and runtime_env merge), from the Ray that pyproject.toml pins.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from importlib import metadata
from pathlib import Path, PurePosixPath

import pytest
import yaml

from grpo_ray.cluster.session import ACTOR_ENV
from grpo_ray.config import load_config, plan_resources

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"
LAUNCHER = "aws-gpu.yaml"
RAYJOB = "rayjob-polaris.yaml"
RUNTIME_ENV = "runtime_env.yaml"

# Field names of KubeRay's ray.io/v1 types (ray-operator/apis/ray/v1/rayjob_types.go and
# raycluster_types.go, KubeRay v1.7.0). The manifest was also validated once against that release's
# full CRD schema (ray-operator/config/crd/bases/ray.io_rayjobs.yaml), too large to keep here.
RAYJOB_SPEC_FIELDS = {
    "activeDeadlineSeconds",
    "backoffLimit",
    "rayClusterSpec",
    "submitterPodTemplate",
    "metadata",
    "clusterSelector",
    "submitterConfig",
    "managedBy",
    "deletionStrategy",
    "entrypoint",
    "runtimeEnvYAML",
    "jobId",
    "submissionMode",
    "entrypointResources",
    "entrypointNumCpus",
    "entrypointNumGpus",
    "ttlSecondsAfterFinished",
    "preRunningDeadlineSeconds",
    "shutdownAfterJobFinishes",
    "suspend",
}
RAYCLUSTER_SPEC_FIELDS = {
    "upgradeStrategy",
    "authOptions",
    "suspend",
    "managedBy",
    "autoscalerOptions",
    "headServiceAnnotations",
    "enableInTreeAutoscaling",
    "gcsFaultToleranceOptions",
    "historyServerOptions",
    "networkPolicy",
    "tlsOptions",
    "headGroupSpec",
    "rayVersion",
    "workerGroupSpecs",
}
HEAD_GROUP_FIELDS = {
    "template",
    "headService",
    "enableIngress",
    "ingressOptions",
    "resources",
    "labels",
    "rayStartParams",
    "serviceType",
}
WORKER_GROUP_FIELDS = {
    "suspend",
    "groupName",
    "replicas",
    "minReplicas",
    "maxReplicas",
    "idleTimeoutSeconds",
    "resources",
    "labels",
    "rayStartParams",
    "template",
    "scaleStrategy",
    "numOfHosts",
}
SUBMISSION_MODES = {"K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"}


def _load(name: str) -> dict:
    return yaml.safe_load((CLUSTER / name).read_text())


def _ray_pin() -> str:
    """ "2.60" from pyproject's `ray[default]==2.60.*`, read from the installed package's metadata."""
    for requirement in metadata.requires("grpo-ray") or []:
        found = re.fullmatch(r"ray\[default\]\s*==\s*(\d+\.\d+)\.\*", requirement.split(";")[0].strip())
        if found:
            return found.group(1)
    raise AssertionError("pyproject.toml no longer pins ray[default]==X.Y.*")


def _needs(config: Path, overrides: list[str] = ()) -> tuple[float, float]:
    """(GPUs, CPUs) the recipe reserves in all: count x num_gpus (num_cpus) summed over its roles."""
    roles = plan_resources(load_config(config, overrides=overrides))
    return sum(r.count * r.num_gpus for r in roles), sum(r.count * r.num_cpus for r in roles)


def _flag(words: list[str], name: str) -> list[str]:
    """Every value of `--name=value` or `--name value` among the words of a command."""
    values = [w.split("=", 1)[1] for w in words if w.startswith(name + "=")]
    values += [words[i + 1] for i, w in enumerate(words[:-1]) if w == name]
    return values


# ---------------------------------------------------------------------------------------------
# Every YAML file here is one of the three checked below, and loads.


def test_every_yaml_file_is_one_the_tests_check():
    assert sorted(p.name for p in CLUSTER.glob("*.yaml")) == sorted([LAUNCHER, RAYJOB, RUNTIME_ENV])
    for name in (LAUNCHER, RAYJOB, RUNTIME_ENV):
        assert isinstance(_load(name), dict), name


def test_readme_names_only_files_that_exist():
    text = (CLUSTER / "README.md").read_text()
    named = set(re.findall(r"cluster/([\w.-]+)", text))
    assert {LAUNCHER, RAYJOB, RUNTIME_ENV} <= named
    assert all((CLUSTER / name).is_file() for name in named), named
    recipes = set(re.findall(r"configs/[\w.-]+\.yaml", text))
    assert recipes and all((ROOT / recipe).is_file() for recipe in recipes), recipes


# ---------------------------------------------------------------------------------------------
# aws-gpu.yaml: the cluster launcher.


def test_launcher_config_validates_against_rays_schema():
    jsonschema = pytest.importorskip("jsonschema")
    import ray.autoscaler

    # The schema `ray up` validates with, shipped inside the pinned Ray wheel.
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(_load(LAUNCHER), schema)


def test_launcher_config_passes_ray_ups_own_preparation():
    pytest.importorskip("jsonschema")
    from ray.autoscaler._private.util import prepare_config, validate_config

    # What `ray up` does before it talks to AWS: merge the AWS defaults, check docker, fill node
    # type bounds, then validate the result.
    prepared = prepare_config(copy.deepcopy(_load(LAUNCHER)))
    validate_config(prepared)
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_every_ray_start_keeps_the_dashboard_on_loopback():
    cfg = _load(LAUNCHER)
    starts = [
        cmd.split(";")[-1]  # the `ray start ...` after `ulimit -n 65536;`
        for cmd in cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]
        if "ray start" in cmd
    ]
    assert sum("--head" in shlex.split(cmd) for cmd in starts) == 1
    assert len(starts) == 2
    for cmd in starts:
        assert _flag(shlex.split(cmd), "--dashboard-host") == ["127.0.0.1"], cmd
    every_command = yaml.safe_dump({k: v for k, v in cfg.items() if k.endswith("_commands")})
    assert "0.0.0.0" not in every_command


def test_setup_installs_this_repository_with_the_vllm_extra():
    cfg = _load(LAUNCHER)
    assert "vllm" in (metadata.metadata("grpo-ray").get_all("Provides-Extra") or [])
    # file_mounts copies the repository root (`ray up` runs there) to some remote folders.
    repo_mounts = {remote for remote, local in cfg["file_mounts"].items() if (ROOT / local).resolve() == ROOT}
    assert repo_mounts
    installed = [
        word.removesuffix("[vllm]").replace("$HOME", "~")
        for cmd in cfg["setup_commands"]
        if "pip install" in cmd
        for word in shlex.split(cmd)
        if word.endswith("[vllm]")
    ]
    assert installed and set(installed) <= repo_mounts, installed
    # setup_commands runs on every node unless a node type replaces it with its own list.
    for name, node_type in cfg["available_node_types"].items():
        assert "worker_setup_commands" not in node_type, name


def test_launcher_runs_the_pinned_ray():
    image = _load(LAUNCHER)["docker"]["image"]
    assert image.startswith(f"rayproject/ray:{_ray_pin()}."), image


def test_launcher_starts_the_nodes_polaris_needs_up_front():
    # grpo-ray compares the recipe with the cluster's resources before it starts any actor, so the
    # GPU workers must exist from `ray up` on (min_workers), not be added by the autoscaler later.
    cfg = _load(LAUNCHER)
    gpus_needed, cpus_needed = _needs(ROOT / "configs" / "polaris.yaml")
    assert gpus_needed == 8
    head_name = cfg["head_node_type"]
    types = cfg["available_node_types"]
    head, workers = types[head_name], [t for name, t in types.items() if name != head_name]
    assert head["resources"].get("GPU", 0) == 0
    assert sum(t["resources"].get("GPU", 0) * t.get("min_workers", 0) for t in workers) >= gpus_needed
    cpus = head["resources"].get("CPU", 0) + sum(
        t["resources"].get("CPU", 0) * t.get("min_workers", 0) for t in workers
    )
    assert cpus >= cpus_needed
    assert sum(t.get("max_workers", 0) for t in workers) <= cfg["max_workers"]


# ---------------------------------------------------------------------------------------------
# rayjob-polaris.yaml: the KubeRay RayJob.


def _entrypoint(spec: dict) -> tuple[str, list[str]]:
    """The recipe and the --set overrides of `grpo-ray train RECIPE --set k=v ...` (nothing else)."""
    words = shlex.split(spec["entrypoint"])
    assert words[:2] == ["grpo-ray", "train"], words
    rest = words[3:]
    assert rest[::2] == ["--set"] * len(rest[::2]) and len(rest) % 2 == 0, rest
    return words[2], rest[1::2]


def _pods(cluster: dict) -> list[dict]:
    return [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]


def _ray_container(pod: dict) -> dict:
    return pod["containers"][0]  # KubeRay's Ray container is the first one


def _cpus(quantity: str | int) -> float:
    text = str(quantity)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def test_rayjob_is_a_kuberay_rayjob_with_known_fields():
    doc = _load(RAYJOB)
    assert doc["apiVersion"] == "ray.io/v1"
    assert doc["kind"] == "RayJob"
    spec = doc["spec"]
    assert set(spec) <= RAYJOB_SPEC_FIELDS, set(spec) - RAYJOB_SPEC_FIELDS
    assert spec.get("submissionMode", "K8sJobMode") in SUBMISSION_MODES
    cluster = spec["rayClusterSpec"]
    assert set(cluster) <= RAYCLUSTER_SPEC_FIELDS, set(cluster) - RAYCLUSTER_SPEC_FIELDS
    assert set(cluster["headGroupSpec"]) <= HEAD_GROUP_FIELDS
    for group in cluster["workerGroupSpecs"]:
        assert set(group) <= WORKER_GROUP_FIELDS, set(group) - WORKER_GROUP_FIELDS
    # rayStartParams is map[string]string in the CRD: a bare number or boolean is refused.
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())
    assert cluster["rayVersion"].startswith(_ray_pin() + ".")


def test_rayjob_deletes_its_cluster_when_the_job_ends():
    spec = _load(RAYJOB)["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert isinstance(spec["ttlSecondsAfterFinished"], int) and spec["ttlSecondsAfterFinished"] > 0


def test_rayjob_entrypoint_trains_a_recipe_from_configs():
    spec = _load(RAYJOB)["spec"]
    recipe, overrides = _entrypoint(spec)
    assert PurePosixPath(recipe).parent == PurePosixPath("configs")
    assert (ROOT / recipe).is_file()
    load_config(ROOT / recipe, overrides=overrides)  # every --set names a real field


def test_rayjob_gpus_are_exactly_what_the_recipe_plans():
    spec = _load(RAYJOB)["spec"]
    recipe, overrides = _entrypoint(spec)
    gpus_needed, cpus_needed = _needs(ROOT / recipe, overrides)
    cluster = spec["rayClusterSpec"]
    head = _ray_container(cluster["headGroupSpec"]["template"]["spec"])
    assert "nvidia.com/gpu" not in head["resources"].get("limits", {})
    # The head takes no actor, so the worker groups hold every role.
    assert cluster["headGroupSpec"]["rayStartParams"].get("num-cpus") == "0"
    gpus = cpus = 0.0
    for group in cluster["workerGroupSpecs"]:
        # Fixed size: grpo-ray checks the resources before any actor starts, so nothing scales up.
        assert (
            group.get("minReplicas", group["replicas"])
            == group["replicas"]
            == group.get("maxReplicas", group["replicas"])
        )
        limits = _ray_container(group["template"]["spec"])["resources"]["limits"]
        gpus += group["replicas"] * int(limits.get("nvidia.com/gpu", 0))
        cpus += group["replicas"] * _cpus(limits["cpu"])
    assert cluster.get("enableInTreeAutoscaling", False) is False
    assert gpus == gpus_needed == 8
    assert cpus >= cpus_needed


def test_rayjob_passes_one_mlflow_address_to_grpo_ray_and_to_the_pods():
    spec = _load(RAYJOB)["spec"]
    recipe, overrides = _entrypoint(spec)
    # grpo-ray reads the recipe's tracking.tracking_uri, not $MLFLOW_TRACKING_URI: the entrypoint
    # must set it, to the same address the pods' environment names.
    uri = load_config(ROOT / recipe, overrides=overrides).tracking.tracking_uri
    assert uri and uri.startswith("http")
    for pod in _pods(spec["rayClusterSpec"]):
        env = {e["name"]: e.get("value") for e in _ray_container(pod).get("env", [])}
        assert env.get("MLFLOW_TRACKING_URI") == uri


def test_rayjob_pods_share_the_image_and_the_output_volume():
    spec = _load(RAYJOB)["spec"]
    recipe, overrides = _entrypoint(spec)
    output_dir = PurePosixPath(load_config(ROOT / recipe, overrides=overrides).output_dir)
    # The driver (head) and learner rank 0 (a worker) both write under output_dir: it must be one
    # claim mounted at the same path in every pod.
    assert output_dir.is_absolute()
    claims, images = set(), set()
    for pod in _pods(spec["rayClusterSpec"]):
        container = _ray_container(pod)
        images.add((container["image"], container.get("workingDir")))
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = [m for m in container["volumeMounts"] if output_dir.is_relative_to(m["mountPath"])]
        assert len(mounts) == 1, container["name"]
        claims.add((mounts[0]["mountPath"], volumes[mounts[0]["name"]]["persistentVolumeClaim"]["claimName"]))
    assert len(claims) == 1, claims
    assert len(images) == 1, images


def test_rayjob_runtime_env_if_any_merges_with_grpo_rays():
    spec = _load(RAYJOB)["spec"]
    if "runtimeEnvYAML" in spec:
        _check_job_runtime_env(yaml.safe_load(spec["runtimeEnvYAML"]))


def test_image_builds_on_the_pinned_ray():
    text = (CLUSTER / "Dockerfile").read_text()
    bases = re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE)
    assert bases and all(b.startswith(f"rayproject/ray:{_ray_pin()}.") for b in bases), bases


# ---------------------------------------------------------------------------------------------
# runtime_env.yaml: `ray job submit --runtime-env`.


def _check_job_runtime_env(env: dict) -> None:
    from ray.runtime_env import RuntimeEnv
    from ray.runtime_env.runtime_env import _merge_runtime_env

    # Only fields Ray documents (its own list, less the internal "_" ones), of the types Ray accepts.
    public = {f for f in RuntimeEnv.known_fields if not f.startswith("_")}
    assert set(env) <= public, set(env) - public
    RuntimeEnv(**env)
    assert all(isinstance(v, str) for v in env.get("env_vars", {}).values())
    # `grpo-ray train` calls ray.init(runtime_env={"env_vars": actor_env()}) inside the job; Ray
    # merges that with the job's runtime_env and refuses the driver on any shared key (None here).
    driver = {"env_vars": {**ACTOR_ENV, "GRPO_RAY_CACHE": "/cache"}}
    assert _merge_runtime_env(RuntimeEnv(**env), driver) is not None, set(env.get("env_vars", {})) & set(
        driver["env_vars"]
    )


def test_runtime_env_has_only_keys_ray_accepts():
    _check_job_runtime_env(_load(RUNTIME_ENV))


def test_runtime_env_keeps_the_virtualenv_and_runs_out_of_the_upload():
    from ray._private.runtime_env.packaging import _get_excludes

    # The matcher Ray applies to every path of the working_dir before zipping it.
    excluded = _get_excludes(ROOT, _load(RUNTIME_ENV)["excludes"])
    for path in [".venv", ".venv/bin/python", "runs", "runs/tiny/mlflow.db", ".cache/grpo-ray", ".git", "mlruns"]:
        assert excluded(ROOT / path), path
    for path in ["grpo_ray/cli.py", "grpo_ray/data", "configs/tiny.yaml", "pyproject.toml", "data/aime24.parquet"]:
        assert not excluded(ROOT / path), path
