"""How a rollout worker samples a group: chosen once, when the worker starts.

    OneTurn          each sample one completion of the prompt (the engine's own batching: hf
                     generates a batch at once, vLLM runs a prompt's G samples as one request and
                     shares their prompt's prefix cache)
    WithEnvironment  each sample an episode of several turns with the recipe's environment
                     (actors/episodes.py), seeded by its place in the step

Both give a prompt's G samples as `Sample`s (actors/slices.py: a one-turn completion is an episode of
one turn), a whole share at once (`groups`) or group by group as they finish (`stream`), so the
worker packs either the same way and nothing above it asks which it has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from grpo_ray.actors.episodes import EpisodeRunner, episode_inputs, episode_sample
from grpo_ray.actors.slices import Sample, one_turn_sample
from grpo_ray.types import Prompt, SamplingSettings

Groups = Iterator[tuple[int, list[Sample]]]  # (k, prompt k's samples)


class Sampler(Protocol):
    turn_credit: float  # EpisodeSettings.turn_credit (0: a sample's reward applies to it whole)

    def groups(self, prompts: list[Prompt], group_offset: int, sampling: SamplingSettings) -> list[list[Sample]]:
        """Every prompt's samples, in prompt order."""

    def stream(
        self, prompts: list[Prompt], group_offset: int, sampling: SamplingSettings, stop: Callable[[], bool] | None
    ) -> Groups:
        """(k, prompt k's samples) as each group is done, in the order they finish; the samples and
        their seeds are those of `groups`. `stop` true: the samples still running are abandoned."""

    def close(self) -> None:
        """Release what the sampler started (an environment's processes)."""


class OneTurn:
    turn_credit = 0.0

    def __init__(self, engine):
        self.engine = engine

    def groups(self, prompts: list[Prompt], group_offset: int, sampling: SamplingSettings) -> list[list[Sample]]:
        completions = self.engine.generate([p.token_ids for p in prompts], sampling)
        return [[one_turn_sample(p, c) for c in group] for p, group in zip(prompts, completions)]

    def stream(
        self, prompts: list[Prompt], group_offset: int, sampling: SamplingSettings, stop: Callable[[], bool] | None
    ) -> Groups:
        for k, group in self.engine.generate_stream([p.token_ids for p in prompts], sampling, stop):
            yield k, [one_turn_sample(prompts[k], c) for c in group]

    def close(self) -> None:
        pass


class WithEnvironment:
    """Episodes: the environment's processes start with the sampler and die with the worker."""

    def __init__(self, engine, runner: EpisodeRunner):
        self.engine, self.runner = engine, runner
        self.turn_credit = runner.settings.turn_credit

    def groups(self, prompts: list[Prompt], group_offset: int, sampling: SamplingSettings) -> list[list[Sample]]:
        rows, seeds, turn = episode_inputs(prompts, group_offset, sampling)
        episodes = self.runner.run(rows, seeds, self.engine.turns(turn))
        g = sampling.samples_per_prompt
        return [[episode_sample(e) for e in episodes[k * g : (k + 1) * g]] for k in range(len(prompts))]

    def stream(
        self, prompts: list[Prompt], group_offset: int, sampling: SamplingSettings, stop: Callable[[], bool] | None
    ) -> Groups:
        rows, seeds, turn = episode_inputs(prompts, group_offset, sampling)
        turns = self.engine.turns(turn)
        for k, episodes in self.runner.stream(rows, seeds, turns, sampling.samples_per_prompt, stop):
            yield k, [episode_sample(e) for e in episodes]

    def close(self) -> None:
        self.runner.close()
