"""Agents end to end: `train` with an environment of several turns (examples/agents/) and with a
class written for TRL's environment_factory, on a real local Ray with the hf engine; each sample an
episode, its model tokens trained on and exact, its figures in MLflow."""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from grpo_ray.config import load_config
from grpo_ray.training.loop import train

from .conftest import HAS_VLLM

NEEDS_VLLM = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")]

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"
TINY_TOOLS = ROOT / "configs" / "tiny-tools.yaml"

TRL_CLASS = '''
class Calculator:
    """Written for TRL's GRPOTrainer(environment_factory=Calculator): reset(**row), public tools, get_reward."""

    def reset(self, **kwargs):
        self.answer = kwargs["answer"]
        self.used = 0

    def multiply(self, a: int, b: int) -> int:
        """Multiply two whole numbers.

        Args:
            a: the first factor
            b: the second factor
        """
        self.used += 1
        return int(a) * int(b)

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


def sample_table(result, step: int) -> list[dict]:
    """The run's sample table of `step` (tracking.samples_every), read from the MLflow store."""
    path = MlflowClient(result.tracking_uri).download_artifacts(result.run_id, f"samples/step_{step:06d}.json")
    table = json.loads(Path(path).read_text())
    return [dict(zip(table["columns"], row)) for row in table["data"]]


def tool_calls_with_replies(table: list[dict]) -> list[tuple[dict, str]]:
    """(the call's arguments, the next line) of every multiply call shown in the table's episodes."""
    found = []
    for row in table:
        lines = row["episode"].splitlines()
        for line, after in zip(lines, lines[1:]):
            if line.startswith("assistant: <tool_call>") and line.endswith("</tool_call>"):
                call = line.removeprefix("assistant: <tool_call>").removesuffix("</tool_call>")
                try:
                    found.append((json.loads(call)["arguments"], after))
                except (ValueError, KeyError):  # a call the model wrote wrong: the calculator says so
                    found.append((None, after))
    return found


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
            "tracking.samples_every=2",
        ]
    recipe = TINY
    if kind == "trl-class":  # the tiny-tools model, which calls multiply in about a quarter of its samples
        (tmp_path / "calculator.py").write_text(TRL_CLASS)
        spec = f"{tmp_path / 'calculator.py'}:Calculator"
        recipe, engine = (
            TINY_TOOLS,
            ["tracking.samples_every=1", "tracking.samples_per_table=64", "train.eval_samples=1"],
        )
    elif kind == "per-turn":
        (tmp_path / "try_twice.py").write_text(TRY_TWICE)
        spec = f"{tmp_path / 'try_twice.py'}:TryTwice"
        engine = ["environment.reward_per_turn=true"]
    else:
        spec = str(ROOT / "examples" / "agents" / "higher_lower.py") + ":HigherLower"
    cfg = load_config(
        recipe,
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
        # Step 2's batch was sampled during step 1's update, for step 2: it kept its conversations.
        assert all(row["episode"].startswith("user: ") for row in sample_table(result, 2))
        return
    # The learner and the engine agree on every token the model wrote (the replies are masked out).
    assert max(history(result, "mismatch/abs_diff_max").values()) < 1e-4
    if kind == "higher-lower":
        assert max(turns.values()) > 1, "wrong answers hear 'higher' or 'lower' and try again"
        assert min(history(result, "episode/masked_tokens").values()) > 0
    else:
        assert min(history(result, "episode/tool_calls").values()) > 0
        assert min(history(result, "reward/environment/mean").values()) > 0  # get_reward: 0.1 a call
        # Every step's sample table shows its episodes: the model's call, the calculator's reply, the answer.
        for step in (1, 2, 3):
            table = sample_table(result, step)
            assert len(table) == 64 and {row["turns"] for row in table} <= {1, 2, 3}
            calls = [(args, reply) for args, reply in tool_calls_with_replies(table) if args is not None]
            assert calls, f"step {step}: no tool call in the table"
            assert all(reply == f"tool: {int(args['a']) * int(args['b'])}" for args, reply in calls)
            assert all(row["tool_calls"] >= ("<tool_call>" in row["episode"]) for row in table)
