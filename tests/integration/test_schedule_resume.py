"""A resumed run continues the LR schedule, the adaptive KL coefficient and the running reward
statistics exactly where the straight run had them (issue 21).

The straight run trains 4 steps with a checkpoint at step 2; the resumed run starts from a copy of
that checkpoint (and of the MLflow store it logs into) and trains steps 3 and 4 again.
"""

import shutil

import pytest
from mlflow.tracking import MlflowClient

from grpo_ray.config import load_config
from grpo_ray.training.loop import train

from .test_faults import SHORT, TINY

SWITCHES = [
    "learner.lr_schedule=cosine",
    "learner.warmup_steps=1",
    "learner.min_lr=1e-6",
    "algorithm.kl_coef=0.01",
    "algorithm.kl_controller=adaptive",
    "algorithm.kl_target=1.0",
    "algorithm.kl_horizon=500",
    "reward.clip=[0,1]",
    "reward.normalize=running",
]
KEYS = ("actor/lr", "kl/coef", "reward/running_mean", "reward/running_std", "loss/total")


def history(tracking_uri: str, run_id: str, key: str) -> dict[int, list[float]]:
    """Every value logged under key, by step, oldest first."""
    by_step: dict[int, list[float]] = {}
    for m in sorted(MlflowClient(tracking_uri).get_metric_history(run_id, key), key=lambda m: m.timestamp):
        by_step.setdefault(m.step, []).append(m.value)
    return by_step


def test_a_resumed_run_continues_the_schedule_the_kl_coefficient_and_the_reward_statistics(tmp_path):
    straight_dir, resumed_dir = tmp_path / "straight", tmp_path / "resumed"
    straight = train(load_config(TINY, [f"output_dir={straight_dir}", *SHORT, *SWITCHES]))
    # The resumed run: the step-2 checkpoint alone, and the MLflow store the straight run logged into.
    (resumed_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(straight_dir / "checkpoints" / "step_000002", resumed_dir / "checkpoints" / "step_000002")
    shutil.copy(straight_dir / "mlflow.db", resumed_dir / "mlflow.db")
    resumed = train(load_config(TINY, [f"output_dir={resumed_dir}", *SHORT, *SWITCHES]), resume="require")
    assert resumed.run_id == straight.run_id and resumed.steps == 4

    want = {key: history(straight.tracking_uri, straight.run_id, key) for key in KEYS}
    got = {key: history(resumed.tracking_uri, resumed.run_id, key) for key in KEYS}
    # The comparison means something: by step 3 the LR has left its peak (cosine), the controller
    # has moved the coefficient (KL far below target: x (1 - 0.2 x 256 / 500) per step), and the
    # running stats hold two steps of rewards.
    assert want["actor/lr"][3][0] < want["actor/lr"][2][0] == pytest.approx(1e-4)
    assert want["kl/coef"][1][0] == 0.01 and want["kl/coef"][3][0] < want["kl/coef"][2][0] < 0.01
    for key in KEYS:
        for step in (3, 4):
            # The copied store holds the straight run's value first, then the resumed run's.
            assert len(got[key][step]) == 2, (key, step)
            assert got[key][step][-1] == pytest.approx(want[key][step][0], rel=1e-6, abs=1e-6), (key, step)
