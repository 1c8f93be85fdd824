"""A phase that stops making progress ends the run in one line naming it (cluster/dispatch.wait_for),
on a real local Ray: calls that return in turn keep it going; one that never returns is named."""

import time

import pytest

from grpo_ray.cluster.dispatch import StalledError, wait_for


def _sleeper(ray):
    @ray.remote(num_cpus=0)
    def sleep_then(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    return sleep_then


def test_calls_that_keep_returning_are_no_stall_though_the_whole_takes_longer(local_ray):
    sleep_then = _sleeper(local_ray)
    # Four workers up before the clock starts (four calls at once each hold one): a worker process
    # started on demand took over 1.2 s on a loaded 2-core machine, which is start-up, not a stall.
    local_ray.get([sleep_then.remote(0.5) for _ in range(4)])
    started = time.monotonic()
    refs = [sleep_then.remote(s) for s in (0.5, 1.0, 1.5, 2.0)]
    wait_for(refs, {ref: f"rollout-{i}" for i, ref in enumerate(refs)}, stall_s=1.2)
    assert time.monotonic() - started >= 1.5  # longer than stall_s in all, never that long without a result


def test_a_call_that_never_returns_is_named_with_its_phase(local_ray):
    sleep_then = _sleeper(local_ray)
    quick, stuck = sleep_then.remote(0.1), sleep_then.remote(60.0)
    started = time.monotonic()
    with pytest.raises(StalledError) as err:
        wait_for([quick, stuck], {quick: "rollout-0", stuck: "rollout-1"}, stall_s=1.0)
    assert time.monotonic() - started < 10
    message = str(err.value)
    assert message.startswith(
        "rollout made no progress for 1 s (weight_sync.timeout_s): nothing came back from rollout-1;"
    )
    assert "\n" not in message
    local_ray.cancel(stuck, force=True)
