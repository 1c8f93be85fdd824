"""A stop request survives a KeyboardInterrupt that something swallowed."""

import os
import signal

import pytest

from grpo_ray.training import interrupts


def test_a_swallowed_interrupt_is_raised_again_at_the_next_check():
    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        interrupts.install()
        interrupts.raise_if_requested()  # nothing requested yet
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            pytest.fail("SIGTERM must raise KeyboardInterrupt")
        except KeyboardInterrupt:
            pass  # e.g. inside a finalizer, where Python reports it as ignored and moves on
        with pytest.raises(KeyboardInterrupt):
            interrupts.raise_if_requested()
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
        interrupts._requested.clear()
