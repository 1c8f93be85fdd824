"""Requests on the vllm engine taken back as each finishes: generate_stream's groups and VllmTurns'
episode turns share this one loop (VllmEngine.submit starts them on the engine's own)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent.futures import Future


class Requests:
    """Requests started on a VllmEngine (engine.submit), each taken back as it finishes; close()
    aborts those still running. Requests started together reach the engine as one batch, and the
    engine batches whatever runs."""

    def __init__(self, engine):
        # engine: the VllmEngine whose loop runs the requests
        self.engine = engine
        self.done: queue.Queue = queue.Queue()  # (key, vLLM's final output or the error), as they finish
        self.running: dict[int, Future] = {}

    def start(self, requests: list[tuple[int, list[int], object]]) -> None:
        """Start (key, prompt token ids, SamplingParams) requests, together."""
        running = self.engine.submit(requests, self.done)
        self.running.update(dict.fromkeys((key for key, _, _ in requests), running))

    def finished(self, timeout: float) -> Iterator[tuple[int, object]]:
        """(key, vLLM's final output) of the requests that finish within `timeout` seconds (every one
        finished by then, at least one if any), in the order they finished. All are taken at once;
        a failed request raises its error in its place, after those before it."""
        try:
            outputs = [self.done.get(timeout=timeout)]
        except queue.Empty:
            return iter(())
        while True:
            try:
                outputs.append(self.done.get_nowait())
            except queue.Empty:
                return self._in_order(outputs)

    def _in_order(self, outputs: list) -> Iterator[tuple[int, object]]:
        for key, output in outputs:
            self.running.pop(key, None)
            if isinstance(output, BaseException):
                raise output
            yield key, output

    def close(self) -> None:
        """Abort the requests still running (AsyncLLM aborts a cancelled request)."""
        for running in set(self.running.values()):
            running.cancel()
        self.running.clear()
