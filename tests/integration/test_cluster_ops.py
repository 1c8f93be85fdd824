"""A real two-node Ray cluster (`ray start` twice on 127.0.0.1): placement, validate, Ray jobs.

The head carries a custom resource `learner_node`; the second node carries `rollout_node` and the
label pool=rollout. Drivers run in their own processes (as under `ray job submit`), never in this
one: Ray reads its auth mode once per process.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from .conftest import ROOT, TINY, free_ports, own_ports, ray_head, ray_processes, run_cli, set_args

BIN = Path(sys.executable).parent
ENV = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1")
SHORT = ["train.steps=2", "data.eval_limit=10"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def ray_cli(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [str(BIN / "ray"), *args], capture_output=True, text=True, env=ENV, timeout=timeout, check=check
    )
    out.stdout, out.stderr = ANSI.sub("", out.stdout), ANSI.sub("", out.stderr)  # the job CLI colours its words
    return out


def job_status(cluster, job: str) -> str:
    """The job's final word as `ray job status` prints it: succeeded, was stopped, failed."""
    out = ray_cli("job", "status", "--address", cluster["dashboard"], job)
    return re.search(rf"Job '{job}' (succeeded|was stopped|failed)", out.stdout + out.stderr).group(1)


@pytest.fixture(scope="module")
def two_nodes():
    (dashboard,) = free_ports(1)
    head = (
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        '--resources={"learner_node": 1}',
    )
    with ray_head(head_args=head) as (gcs, temp_dir):
        ray_cli(
            "start",
            f"--address={gcs}",
            "--node-ip-address=127.0.0.1",
            '--resources={"rollout_node": 2}',
            "--labels=pool=rollout",
            *own_ports(),
        )
        yield {"gcs": gcs, "dashboard": f"http://127.0.0.1:{dashboard}", "nodes": node_ids(gcs)}
    # Both nodes' daemons ran under the head's temp dir, and ray_head stopped them all.
    assert not [line for line in ray_processes() if temp_dir in line]


def node_ids(address: str) -> dict[str, str]:
    """Node id of the node holding each custom resource, read by a driver of its own."""
    code = (
        "import json, ray; ray.init(address=%r, logging_level='ERROR'); "
        "print(json.dumps({k: n['NodeID'] for n in ray.nodes() if n['Alive'] for k in n['Resources'] "
        "if k in ('learner_node', 'rollout_node')}))" % address
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def train_on(cluster, output_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    sets = set_args(f"output_dir={output_dir}", f"ray.address={cluster['gcs']}", *SHORT, *overrides)
    return run_cli("train", str(TINY), *sets, timeout=400, RAY_AUTH_MODE="disabled")


def test_rollout_workers_and_learners_land_where_the_config_targets_them(two_nodes, tmp_path):
    # Two rollout workers instead of one is a number in the recipe: nothing else changes. The reward
    # worker shares the learner's bundle (colocated), so SPREAD cannot send it to another node.
    out = train_on(
        two_nodes,
        tmp_path,
        "rollout.num_workers=2",
        "rollout.node_labels={pool: rollout}",
        "learner.resources={learner_node: 1}",
        "placement.colocate=[learner, reward]",
        "placement.strategy=SPREAD",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step 2/2" in out.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("grpo-ray").experiment_id])
    (run,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]  # not its stage run
    tags = run.data.tags
    assert tags["cluster.nodes"] == "2"
    assert tags["placement.learner-0"] == two_nodes["nodes"]["learner_node"]
    assert tags["placement.rollout-0"] == tags["placement.rollout-1"] == two_nodes["nodes"]["rollout_node"]
    assert tags["placement.reward-0"] == two_nodes["nodes"]["learner_node"]
    assert len(client.get_metric_history(run.info.run_id, "loss/total")) == 2


def test_validate_checks_the_plan_against_the_connected_cluster(two_nodes):
    def validate(*overrides: str) -> subprocess.CompletedProcess:
        sets = set_args(*overrides)
        return run_cli(
            "validate", str(TINY), "--address", two_nodes["gcs"], *sets, timeout=120, RAY_AUTH_MODE="disabled"
        )

    fits = validate("rollout.node_labels={pool: rollout}", "learner.resources={learner_node: 1}")
    assert fits.returncode == 0, fits.stderr
    assert re.search(r"the plan on the cluster at \S+ \(2 nodes: CPU 4, learner_node 1, rollout_node 2\)", fits.stdout)
    assert fits.stdout.rstrip().endswith("ok")
    short = validate(
        "rollout.num_gpus=4",
        "rollout.num_workers=2",
        "learner.resources={gpu_node: 2}",
        "reward.node_labels={pool: reward}",
    )
    assert short.returncode == 1
    where = f"on the cluster at {two_nodes['gcs']} (2 nodes: CPU 4, learner_node 1, rollout_node 2); free or add"
    lines = [line for line in short.stderr.splitlines() if line.startswith("error:")]
    assert [line.split(where)[0] for line in lines] == [
        "error: rollout needs 8 GPUs, there are 0 ",
        "error: learner needs resource gpu_node x2, no node has it ",
        "error: reward needs a node labelled pool=reward, no node has that label ",
    ], short.stderr
    assert all(where in line for line in lines)


def submit(cluster, tmp_path: Path, name: str, *overrides: str, output: str | None = None) -> str:
    """`ray job submit --no-wait` of `grpo-ray train` into tmp_path/(output or name); returns the submission id."""
    workdir = tmp_path / f"{name}-job"
    workdir.mkdir()
    (workdir / "README").write_text("grpo-ray test job\n")  # what --working-dir uploads: keep it small
    sets = set_args(f"output_dir={tmp_path / (output or name)}", *SHORT, *overrides)
    out = ray_cli(
        "job",
        "submit",
        "--address",
        cluster["dashboard"],
        "--working-dir",
        str(workdir),
        "--no-wait",
        "--",
        str(BIN / "grpo-ray"),
        "train",
        str(TINY),
        *sets,
    )
    return re.search(r"Job '(raysubmit_\w+)' submitted successfully", out.stdout + out.stderr).group(1)


README_SUBMIT = next(
    line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("ray job submit")
)


def test_the_readmes_job_submit_runs_from_an_uploaded_working_dir(two_nodes, tmp_path):
    # The README's command with this cluster's address, this checkout's .venv for /opt/grpo-ray's,
    # a temporary folder for /shared, and SHORT: the recipe is read inside the uploaded folder.
    project = tmp_path / "project"
    shutil.copytree(ROOT / "configs", project / "configs")
    command = (
        README_SUBMIT.replace("http://HEAD:8265", two_nodes["dashboard"])
        .replace("/opt/grpo-ray/.venv/bin", str(BIN))
        .replace("/shared", str(tmp_path / "shared"))
    )
    args = shlex.split(command)
    args[3:3] = ["--no-wait"]  # after `ray job submit`
    args += set_args(*SHORT)
    out = subprocess.run(
        [str(BIN / "ray"), *args[1:]], cwd=project, capture_output=True, text=True, env=ENV, timeout=120
    )
    job = re.search(r"Job '(raysubmit_\w+)' submitted successfully", ANSI.sub("", out.stdout + out.stderr)).group(1)
    logs = ray_cli("job", "logs", "-f", "--address", two_nodes["dashboard"], job, timeout=400)
    assert "step 1/2" in logs.stdout and "step 2/2" in logs.stdout and "done: held-out accuracy" in logs.stdout
    assert job_status(two_nodes, job) == "succeeded"
    assert (tmp_path / "shared" / "runs" / "tiny" / "mlflow.db").is_file(), "the run's store on the shared folder"


def listed(cluster, kind: str, state: str) -> list[dict]:
    """`ray list KIND --filter STATE` as records (it prints a sentence, not [], when there are none)."""
    out = ray_cli("list", kind, "--address", cluster["dashboard"], "--filter", state, "--format", "json").stdout
    return json.loads(out) if out.lstrip().startswith("[") else []


def test_a_stopped_job_takes_every_actor_it_started_with_it(two_nodes, tmp_path):
    job = submit(two_nodes, tmp_path, "stopped", "train.steps=500")
    deadline = time.monotonic() + 300
    while "step 1/500" not in ray_cli("job", "logs", "--address", two_nodes["dashboard"], job).stdout:
        assert time.monotonic() < deadline, "the job never reached step 1"
        time.sleep(1)
    alive = listed(two_nodes, "actors", "state=ALIVE")
    assert {a["class_name"] for a in alive} >= {"LearnerWorker", "RolloutWorker", "RewardWorker"}
    ray_cli("job", "stop", "--address", two_nodes["dashboard"], job, timeout=120)
    deadline = time.monotonic() + 60
    while True:
        alive = listed(two_nodes, "actors", "state=ALIVE")
        groups = listed(two_nodes, "placement-groups", "state=CREATED")
        if not alive and not groups:
            break
        assert time.monotonic() < deadline, (
            f"still alive after ray job stop: {[a['class_name'] for a in alive]}, {groups}"
        )
        time.sleep(1)
    assert job_status(two_nodes, job) == "was stopped"


def test_a_job_whose_driver_died_resumes_when_submitted_again(two_nodes, tmp_path):
    # The driver of a submitted job is SIGKILLed (a lost node, an OOM kill) after its step-2
    # checkpoint; submitting the same command again continues from it, in the same MLflow run.
    args = ("train.steps=6", "train.checkpoint_every=2")
    first = submit(two_nodes, tmp_path, "first", *args, output="resubmitted")
    state = tmp_path / "resubmitted" / "checkpoints" / "step_000002" / "state.json"
    deadline = time.monotonic() + 300
    while not state.exists():
        assert time.monotonic() < deadline, "the job never wrote its step-2 checkpoint"
        time.sleep(0.5)
    drivers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "train" in (p.info["cmdline"] or [])
        and f"output_dir={tmp_path / 'resubmitted'}" in (p.info["cmdline"] or [])
    ]
    assert len(drivers) == 1, [p.info["cmdline"] for p in drivers]
    drivers[0].kill()
    deadline = time.monotonic() + 120
    while (status := job_status_now(two_nodes, first)) is None:
        assert time.monotonic() < deadline, "Ray never noticed the driver's death"
        time.sleep(1)
    assert status == "failed"

    again = submit(two_nodes, tmp_path, "again", *args, output="resubmitted")
    logs = ray_cli("job", "logs", "-f", "--address", two_nodes["dashboard"], again, timeout=400).stdout
    assert re.search(r"resuming from .*step_00000[24] \(step [24]\)", logs), logs[-2000:]
    assert "step 6/6" in logs and job_status(two_nodes, again) == "succeeded"
    client = MlflowClient(f"sqlite:///{tmp_path / 'resubmitted' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("grpo-ray").experiment_id])
    (run,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert run.info.status == "FINISHED"
    assert {m.step for m in client.get_metric_history(run.info.run_id, "loss/total")} == set(range(1, 7))


def job_status_now(cluster, job: str) -> str | None:
    """The job's final word (succeeded, was stopped, failed) once it has one; None while it runs."""
    out = ray_cli("job", "status", "--address", cluster["dashboard"], job, check=False)
    match = re.search(rf"Job '{job}' (succeeded|was stopped|failed)", out.stdout + out.stderr)
    return match.group(1) if match else None
