"""Agents end to end: `train` with an environment of several turns (examples/agents/) and with a
class written for TRL's environment_factory, on a real local Ray with the hf engine; each sample an
episode, its model tokens trained on and exact, its figures in MLflow."""

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from grpo_ray.config import load_config
from grpo_ray.training.loop import train

from .conftest import HAS_VLLM

NEEDS_VLLM = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")]

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"

TRL_CLASS = '''
class Calculator:
    """Written for TRL's GRPOTrainer(environment_factory=Calculator): reset(**row), public tools, get_reward."""

    def reset(self, **kwargs):
        self.answer = kwargs["answer"]
        self.used = 0

    def add(self, a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: first
            b: second
        """
        self.used += 1
        return a + b

    def get_reward(self) -> float:
        return 0.1 * self.used
'''

TRY_TWICE = """
from grpo_ray.envs import Environment, StepResult


class TryTwice(Environment):
    # The first step pays 1 for trying; the second pays for an answer of odd length (the groups'
    # rewards then differ, whatever the tiny model writes).
    def reset(self, row):
        self.turn = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        self.turn += 1
        reward = 1.0 if self.turn == 1 else float(len(text) % 2)
        return StepResult([{"role": "user", "content": "again"}], reward=reward, done=self.turn >= 2)
"""


def history(result, key):
    return {m.step: m.value for m in MlflowClient(result.tracking_uri).get_metric_history(result.run_id, key)}


# vllm-pipelined: the vllm engine (prefix cache on, 32-token blocks) in a pipelined run, whose syncs
# may land mid-episode (tested where it certainly does: test_vllm_engine.py).
# per-turn: environment.reward_per_turn, an environment whose first step pays: the answer turn's
# advantage leaves that reward out (its size, per token: actor/turn_credit).
@pytest.mark.parametrize(
    "kind", ["higher-lower", "trl-class", "per-turn", pytest.param("vllm-pipelined", marks=NEEDS_VLLM)]
)
def test_an_agent_trains_on_episodes(tmp_path, kind):
    engine = []
    if kind == "vllm-pipelined":
        engine = [
            "rollout.backend=vllm",
            "rollout.max_staleness=1",
            "rollout.vllm.cpu_kv_cache_gb=0.25",
            "rollout.vllm.block_size=32",
            "weight_sync.probe_every=1",
        ]
    if kind == "trl-class":
        (tmp_path / "calculator.py").write_text(TRL_CLASS)
        spec = f"{tmp_path / 'calculator.py'}:Calculator"
    elif kind == "per-turn":
        (tmp_path / "try_twice.py").write_text(TRY_TWICE)
        spec = f"{tmp_path / 'try_twice.py'}:TryTwice"
        engine = ["environment.reward_per_turn=true"]
    else:
        spec = str(ROOT / "examples" / "agents" / "higher_lower.py") + ":HigherLower"
    cfg = load_config(
        TINY,
        [
            f"output_dir={tmp_path / 'run'}",
            "train.steps=3",
            "train.eval_every=0",
            "data.eval_limit=20",
            f"environment.spec={spec}",
            "environment.max_turns=3",
            "environment.max_episode_tokens=48",
            "train.prompts_per_step=8",
            "learner.micro_batch_size=64",
            *engine,
        ],
    )
    result = train(cfg)
    assert result.steps == 3
    turns = history(result, "episode/turns")
    assert sorted(turns) == [1, 2, 3] and all(1 <= t <= 3 for t in turns.values())
    assert len(history(result, "reward/environment/mean")) == 3
    assert max(history(result, "episode/failed").values()) == 0
    if kind == "per-turn":
        assert set(turns.values()) == {2.0}
        assert min(history(result, "reward/environment/mean").values()) >= 1.0
        # Some group had a spread in its answers: its second turns' advantages left the first step's 1.0 out.
        assert max(history(result, "actor/turn_credit").values()) > 0
        return
    if kind == "vllm-pipelined":
        # Later turns found the episode's earlier blocks in vLLM's prefix cache; every sync proven.
        assert max(history(result, "episode/cached_tokens").values()) > 0
        assert sorted(history(result, "sync/during_generation")) == [1, 2, 3]
        assert max(history(result, "batch/staleness").values()) == 1.0
        return
    # The learner and the engine agree on every token the model wrote (the replies are masked out).
    assert max(history(result, "mismatch/abs_diff_max").values()) < 1e-4
    if kind == "higher-lower":
        assert max(turns.values()) > 1, "wrong answers hear 'higher' or 'lower' and try again"
        assert min(history(result, "episode/masked_tokens").values()) > 0
    else:
        assert history(result, "episode/tool_calls") == {1: 0.0, 2: 0.0, 3: 0.0}  # the tiny model writes no calls
