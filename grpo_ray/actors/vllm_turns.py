"""Episode turns on the vllm engine (actors/episodes.py's `Turns`), as requests of VllmEngine's own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
from dataclasses import replace

from grpo_ray.types import Completion, SamplingSettings


class VllmTurns:
    """Episode turns as vLLM requests (actors/episodes.py's `Turns`): each turn starts the moment its
    episode is ready and is handed back the moment it finishes; the engine batches whatever turns
    are running, so no episode waits for another's turn or step.

    An episode's later turns reuse its earlier ones through vLLM's prefix cache (on by default): a
    turn's request computes only what the cache lacks (its Completion's `cached_tokens` says how
    much it found). After a sync, blocks cached with the old weights are dropped as soon as no
    request holds one (VllmEngine._drop_stale_prefixes); until then a turn may reuse them, as a
    running request keeps the KV it has: its tokens' log-probs are still the engine's own, which the
    learner's importance correction takes as the behaviour policy's.
    Seeds: the episode runner's, one per turn, through vLLM's per-request generator, so a turn is
    the same whatever runs beside it."""

    def __init__(self, engine, sampling: SamplingSettings):
        # engine: the VllmEngine whose loop runs the requests (its turns() makes these)
        self.engine, self.sampling = engine, sampling
        self.done: queue.Queue = queue.Queue()
        self.running: dict[int, concurrent.futures.Future] = {}
        self.open = True
        engine._episodes_open += 1

    def start(self, key: int, context: list[int], seed: int) -> None:
        params = self.engine.request_params(self.sampling, 1, seed)
        self.engine._drop_stale_prefixes()
        self.running[key] = asyncio.run_coroutine_threadsafe(
            self.engine._request(key, list(context), params, self.done), self.engine._loop
        )

    def finished(self, timeout: float) -> list[tuple[int, Completion]]:
        """The turns that finish within `timeout` seconds (every one finished by then, at least one if any)."""
        try:
            outputs = [self.done.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                outputs.append(self.done.get_nowait())
            except queue.Empty:
                break
        turns = []
        for key, output in outputs:
            self.running.pop(key, None)
            if isinstance(output, BaseException):
                raise output
            [sample] = output.outputs
            text = self.engine.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
            turn = self.engine._completion(sample, text)
            turns.append((key, replace(turn, cached_tokens=int(output.num_cached_tokens or 0))))
        return turns

    def close(self) -> None:
        """The episode loop is over: abort the turns still running (it ended by an error)."""
        for future in self.running.values():
            future.cancel()
        self.running.clear()
        if self.open:
            self.open = False
            self.engine._episodes_open -= 1
