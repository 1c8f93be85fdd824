"""Episode turns on the vllm engine (actors/episodes.py's `Turns`), as requests of VllmEngine's own."""

from __future__ import annotations

from dataclasses import replace

from grpo_ray.actors.vllm_requests import Requests
from grpo_ray.types import Completion, SamplingSettings


class VllmTurns:
    """Episode turns as vLLM requests (actors/episodes.py's `Turns`): each turn starts the moment its
    episode is ready and is handed back the moment it finishes; the engine batches whatever turns
    are running, so no episode waits for another's turn or step.

    An episode's later turns reuse its earlier ones through vLLM's prefix cache (on by default): a
    turn's request computes only what the cache lacks (its Completion's `cached_tokens` says how
    much it found). After a sync, blocks cached with the old weights are dropped as soon as no
    request holds one (VllmEngine.submit); until then a turn may reuse them, as a running request
    keeps the KV it has: its tokens' log-probs are still the engine's own, which the learner's
    importance correction takes as the behaviour policy's.
    Seeds: the episode runner's, one per turn, through vLLM's per-request generator, so a turn is
    the same whatever runs beside it."""

    def __init__(self, engine, sampling: SamplingSettings):
        # engine: the VllmEngine whose loop runs the requests (its turns() makes these)
        self.engine, self.sampling = engine, sampling
        self.requests = Requests(engine)
        self.open = True
        engine.episode_loop_began()

    def start(self, key: int, context: list[int], seed: int) -> None:
        self.requests.start([(key, list(context), self.engine.request_params(self.sampling, 1, seed))])

    def finished(self, timeout: float) -> list[tuple[int, Completion]]:
        """The turns that finish within `timeout` seconds (every one finished by then, at least one if any)."""
        turns = []
        for key, output in self.requests.finished(timeout):
            [sample] = output.outputs
            text = self.engine.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
            turn = self.engine.completion(sample, text)
            turns.append((key, replace(turn, cached_tokens=int(output.num_cached_tokens or 0))))
        return turns

    def close(self) -> None:
        """The episode loop is over: abort the turns still running (it ended by an error)."""
        self.requests.close()
        if self.open:
            self.open = False
            self.engine.episode_loop_ended()
