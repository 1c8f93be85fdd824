"""Multi-turn episodes on a rollout engine: generate, let the environment answer, generate again,
until the environment says done, the turn limit, the token budget or a timeout.

    runner = EpisodeRunner(settings, tokenizer)              # starts the environment's processes
    episodes = runner.run(rows, seeds, engine.turns(sampling))  # one Episode per (row, seed)

The episodes of a call run side by side, not turn by turn in lockstep: an episode's next turn
starts as soon as its environment has answered, and goes to the environment as soon as it is
generated, while the environment's processes work on the others' steps; an episode whose
environment or turn is slow holds only itself. The engine's `Turns` decide how started turns
are batched: the hf engine generates those started since it was last asked as one batch
(hf_engine.TurnBatches), vLLM runs each as a request of its own and hands it back when it is done
(vllm_turns.VllmTurns). Each turn is drawn from the episode's own seed (seed, turn), so an
episode run again from its seed is the same episode, whatever it is batched with (recovery
re-issues a dead worker's episodes that way). The row an episode becomes is envs/episode.py's; its reward from the
environment (steps plus reward()) goes in the row field `environment_reward` (NaN: it failed), and
why it failed in `environment_error`, one line naming the method and what to change (envs/failures.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

import numpy as np

from grpo_ray.actors.slices import Sample
from grpo_ray.envs.contract import PROMPT_MESSAGES
from grpo_ray.chat_template import reply_tokens
from grpo_ray.envs.episode import EpisodeTokens
from grpo_ray.envs.failures import FAILURE_KINDS, LOST, episode_timeout_line, failure_kind, failure_line
from grpo_ray.envs.runner import EnvironmentPool, EnvReply
from grpo_ray.rewards.environment import ERROR_FIELD, LOST_FIELD, TOOL_ERROR_FIELD
from grpo_ray.rewards.environment import FIELD as ENVIRONMENT_FIELD
from grpo_ray.types import EPISODE_FIELD_PREFIX, Completion, Prompt, SamplingSettings


class Turns(Protocol):
    """An engine's turns of episodes (hf_engine.TurnBatches, vllm_turns.VllmTurns)."""

    def start(self, key: int, context: list[int], seed: int) -> None:
        """Begin generating one turn: a completion of `context` drawn with `seed`."""

    def finished(self, timeout: float) -> list[tuple[int, Completion]]:
        """(key, turn) of turns done, waiting at most `timeout` seconds for the first."""

    def close(self) -> None:
        """Abandon the turns still running."""


# Turn seeds stay below 2**63, what torch's and vLLM's generators take.
SEED_RANGE = 2**63
# An episode's counts: its tool calls, overflows and (0 or 1) its failure's kind (envs/failures.py).
COUNTS = ("tool_calls", "unparsable_calls", "tool_errors", "overflows", *FAILURE_KINDS)


class State(Enum):
    """What an episode waits on. Each state but GENERATE and DONE is answered by one handler: the
    engine's finished turn (_take_turn) or the environment's reply to its request (REPLY_HANDLERS)."""

    RESET = "reset"  # the environment's first messages and tools
    GENERATE = "generate"  # its next turn, to be started
    GENERATING = "generating"  # the engine's turn
    STEP = "step"  # the environment's answer to the turn
    FINISH = "finish"  # the environment's reward() and the instance's release
    DONE = "done"

    @property
    def on_environment(self) -> bool:
        return self in (State.RESET, State.STEP, State.FINISH)

    @property
    def running(self) -> bool:
        """Whether its time limit still applies (a finishing episode already ended)."""
        return self in (State.STEP, State.GENERATE, State.GENERATING)


@dataclass(frozen=True)
class EpisodeSettings:
    spec: str  # environment.spec
    options: dict
    max_turns: int
    max_episode_tokens: int
    step_timeout_s: float
    episode_timeout_s: float
    processes: int
    # environment.reward_weight with environment.reward_per_turn, else 0: the weight of the step
    # rewards a turn did not earn (RolloutSlice.reward_before); 0: the episode's reward applies whole.
    turn_credit: float = 0.0


@dataclass
class Episode:
    tokens: EpisodeTokens
    answer: str = ""  # the text of the model's last turn (what the reward functions score)
    reward: float = 0.0  # the environment's: its steps' rewards plus reward() at the end
    finish_reason: str = "stop"  # "stop": the environment said done; "length": a limit ended it
    error: str | None = None  # one line when the environment failed (the episode's reward is then NaN)
    lost: bool = False  # it failed with a process another episode's request ended
    tool_error: str | None = None  # its first tool call that failed, one line
    tools: int = 0  # the tools its environment showed the model
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    started: float = field(default_factory=time.monotonic)
    ended: float = 0.0  # when its last reply came (time.monotonic)
    state: State = State.RESET
    cached_tokens: int = 0  # of its turns' contexts, the tokens the engine found in its prefix cache
    context_tokens: int = 0  # its turns' contexts together (what a turn without any cache computes first)
    turn_seed: int = 0
    key: int = 0  # its instance's key in the environment pool (unique across calls)
    # The conversation as the environment saw it: its first messages, each model turn ("assistant",
    # the text step() read), each reply; packed into the slice only when asked (SamplingSettings.keep_messages).
    messages: list[dict] = field(default_factory=list)


class EpisodeRunner:
    def __init__(self, settings: EpisodeSettings, tokenizer):
        self.settings, self.tokenizer = settings, tokenizer
        self.end_of_turn = tokenizer.eos_token_id
        self.pool = EnvironmentPool(settings.spec, settings.options, settings.processes, settings.step_timeout_s)
        self.class_name = settings.spec.rpartition(":")[2]  # what failure lines name (envs/failures.py)
        self._next_key = 0
        self._abandoned: set[int] = set()  # keys of episodes a stopped stream left in the environment

    def render(self, messages: list[dict], add_generation_prompt: bool, tools: list | None = None) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=True
        )
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def run(self, rows: list[dict], seeds: list[int], turns: Turns) -> list[Episode]:
        """One Episode per (row, seed), in order."""
        return [episode for _, [episode] in sorted(self.stream(rows, seeds, turns, 1))]

    def stream(
        self,
        rows: list[dict],
        seeds: list[int],
        turns: Turns,
        group_size: int,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[tuple[int, list[Episode]]]:
        """(k, the episodes of group k) as each group's `group_size` episodes (rows k*group_size
        onwards) are all done, in the order they finish. `stop` is asked between rounds: True
        abandons the episodes still running and ends the stream."""
        base, self._next_key = self._next_key, self._next_key + len(rows)
        episodes = [Episode(EpisodeTokens(prompt=[]), turn_seed=seed, key=base + i) for i, seed in enumerate(seeds)]
        pending = set(range(len(rows) // group_size))
        for episode, row in zip(episodes, rows):
            self.pool.send("reset", episode.key, row)
        try:
            while pending and not (stop is not None and stop()):
                self._round(episodes, turns)
                for k in sorted(pending):
                    group = episodes[k * group_size : (k + 1) * group_size]
                    if all(e.state is State.DONE for e in group):
                        pending.discard(k)
                        yield k, group
        finally:
            turns.close()
            self._abandoned |= {e.key for e in episodes if e.state is not State.DONE}

    def _round(self, episodes: list[Episode], turns: Turns) -> None:
        """Start every ready turn, then take what the engine and the environment have finished."""
        for index, episode in enumerate(episodes):
            if episode.state is State.GENERATE:
                seed = (episode.turn_seed * 1_000_003 + episode.tokens.turns) % SEED_RANGE
                turns.start(index, episode.tokens.context, seed)
                episode.context_tokens += len(episode.tokens.context)
                episode.state = State.GENERATING
        generating = any(e.state is State.GENERATING for e in episodes)
        stepping = any(e.state.on_environment for e in episodes)
        # Both sides work at once: each is asked in turn, briefly while the other has work.
        done = turns.finished(0.02 if stepping else 0.5) if generating else []
        for index, turn in done:
            self._take_turn(episodes[index], turn)
        base = episodes[0].key
        for reply in self.pool.poll(0.0 if generating or done else 0.5):
            if 0 <= reply.episode - base < len(episodes):
                self._receive(episodes[reply.episode - base], reply)
            elif reply.episode in self._abandoned:  # a stopped stream's: its instance is freed
                if reply.op == "finish":
                    self._abandoned.discard(reply.episode)
                elif reply.error is None:
                    self.pool.send("finish", reply.episode)
        self._expire(episodes)

    def close(self) -> None:
        self.pool.close()

    def _take_turn(self, episode: Episode, turn: Completion) -> None:
        if episode.state is not State.GENERATING:
            return  # the episode ended meanwhile (its time ran out)
        room = self.settings.max_episode_tokens - episode.tokens.length
        ids, logprobs = list(turn.token_ids[:room]), list(turn.logprobs[:room])
        # Until its end, an episode's reward is its steps' so far: what this turn did not earn.
        episode.tokens.add_turn(ids, logprobs, earned_before=episode.reward)
        episode.cached_tokens += turn.cached_tokens
        episode.answer = (
            turn.text if len(ids) == len(turn.token_ids) else self.tokenizer.decode(ids, skip_special_tokens=True)
        )
        episode.messages.append({"role": "assistant", "content": episode.answer})
        # Out of budget, or of turns: the episode ends here. A turn cut by rollout.max_new_tokens
        # alone goes to the environment as written, which decides (as it would a human's).
        out_of_budget = len(ids) < len(turn.token_ids) or episode.tokens.length >= self.settings.max_episode_tokens
        if out_of_budget or episode.tokens.turns >= self.settings.max_turns:
            ended = bool(ids) and ids[-1] == self.end_of_turn
            episode.finish_reason = "stop" if ended and not out_of_budget else "length"
            self._finish(episode)
        else:
            episode.state = State.STEP
            self.pool.send("step", episode.key, episode.answer)

    def _receive(self, episode: Episode, reply: EnvReply) -> None:
        """The environment's reply to the episode's request, handed to that request's handler."""
        answered = State(reply.op)
        if episode.state is State.DONE or (episode.state is State.FINISH and answered is not State.FINISH):
            return  # a reply to a request the episode gave up on (it timed out meanwhile)
        if reply.error is not None:
            self._failed(episode, reply, answered)
            return
        handler = {State.RESET: self._after_reset, State.STEP: self._after_step, State.FINISH: self._after_finish}
        handler[answered](episode, reply.value)

    def _failed(self, episode: Episode, reply: EnvReply, answered: State) -> None:
        # Only its first failure counts: a finish after a failed reset may fail for want of state.
        if episode.error is None:
            episode.error = failure_line(self.class_name, reply.op, reply.failure, reply.error)
            episode.lost = reply.failure == LOST
            episode.counts[failure_kind(reply.op, reply.failure)] += 1
        if answered is State.FINISH:
            episode.state, episode.ended = State.DONE, time.monotonic()
        else:
            self._finish(episode)

    def _after_reset(self, episode: Episode, value) -> None:
        messages, tools = value
        episode.tokens.prompt = self.render(messages, True, tools)
        episode.tools = len(tools)
        episode.messages = list(messages)
        episode.state = State.GENERATE

    def _after_finish(self, episode: Episode, reward: float | None) -> None:
        episode.reward += reward or 0.0
        episode.state, episode.ended = State.DONE, time.monotonic()

    def _after_step(self, episode: Episode, step) -> None:
        episode.reward += step.reward
        episode.messages += step.messages
        for name, count in step.counts.items():
            episode.counts[name] = episode.counts.get(name, 0) + count
        if step.errors and episode.tool_error is None:
            episode.tool_error = step.errors[0]
        if step.done:
            episode.finish_reason = "stop"
            self._finish(episode)
            return
        reply = reply_tokens(self.render, self.end_of_turn, step.messages)
        if episode.tokens.ids[-1:] != [self.end_of_turn]:  # a turn cut by max_new_tokens: the template closes it
            reply = [self.end_of_turn] + reply
        if episode.tokens.length + len(reply) >= self.settings.max_episode_tokens:
            episode.counts["overflows"] += 1
            episode.finish_reason = "length"
            self._finish(episode)
            return
        episode.tokens.add_reply(reply)
        episode.state = State.GENERATE

    def _finish(self, episode: Episode) -> None:
        episode.state = State.FINISH
        self.pool.send("finish", episode.key)

    def _expire(self, episodes: list[Episode]) -> None:
        now = time.monotonic()
        for episode in episodes:
            if episode.state.running and now - episode.started > self.settings.episode_timeout_s:
                episode.error = episode_timeout_line(self.settings.episode_timeout_s)
                episode.counts["episode_timeouts"] += 1
                self._finish(episode)


def episode_sample(episode: Episode) -> Sample:
    """An episode as the row it becomes (actors/slices.py): its tokens exact (envs/episode.py), its
    last answer what the reward functions score, its figures and failure in its fields."""
    input_ids, mask, logprobs = episode.tokens.arrays()
    return Sample(
        input_ids=input_ids,
        completion_mask=mask,
        logprobs=logprobs,
        answer=episode.answer,
        finish_reason=episode.finish_reason,
        fields=episode_fields(episode),
        earned=episode.tokens.earned_array(),
        messages=list(episode.messages),
    )


def episode_fields(episode: Episode) -> dict[str, float | str | None]:
    """An episode's row fields: its environment reward (NaN: failed; rewards/environment.py), why it
    failed and its first failed tool call (one line each, or None), and its figures (episode_<name>:
    the run's episode/<name> and env_failures/<kind> metrics, through ScoredSlice.episode_stats)."""
    mask = np.asarray(episode.tokens.mask)
    figures = {
        "turns": episode.tokens.turns,
        "tokens": episode.tokens.length,
        "masked_tokens": int((mask == 0).sum()),
        "cached_tokens": episode.cached_tokens,
        "failed": int(episode.error is not None),
        "tools": episode.tools,
        **episode.counts,
    }
    reward = float("nan") if episode.error is not None else episode.reward
    errors = {
        ERROR_FIELD: None if episode.lost else episode.error,
        LOST_FIELD: episode.error if episode.lost else None,
        TOOL_ERROR_FIELD: episode.tool_error,
    }
    return {ENVIRONMENT_FIELD: reward, **errors, **{EPISODE_FIELD_PREFIX + k: float(v) for k, v in figures.items()}}


def episode_inputs(
    prompts: list[Prompt], group_offset: int, sampling: SamplingSettings
) -> tuple[list[dict], list[int], SamplingSettings]:
    """Each episode's data row and seed (from its group's id and its place in the group, so a share
    issued again runs the same episodes), and the sampling of one turn."""
    g = sampling.samples_per_prompt
    rows = [episode_row(p) for p in prompts for _ in range(g)]
    seeds = [sampling.seed * 1_000_003 + (group_offset + k) * g + j for k in range(len(prompts)) for j in range(g)]
    return rows, seeds, replace(sampling, samples_per_prompt=1)


def episode_row(prompt: Prompt) -> dict:
    """The data row an episode's environment gets: the prompt's text, answer and fields, and its
    whole chat when the data gave it messages before the user's."""
    row = {"prompt": prompt.text, "answer": prompt.answer, **prompt.fields}
    if prompt.context:
        row[PROMPT_MESSAGES] = [*prompt.context, {"role": "user", "content": prompt.text}]
    return row
