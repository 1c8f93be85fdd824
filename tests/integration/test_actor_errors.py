"""The one line a run prints when an actor dies says why Ray says it died."""

import pytest
import ray
from ray.core.generated.common_pb2 import ActorDiedErrorContext

from grpo_ray.cluster.placement import error_line


def test_a_never_started_actor_reports_rays_reason_not_only_the_closing_note():
    context = ActorDiedErrorContext(
        error_message="The actor is dead because its owner has died.",
        actor_id=bytes(16),
        class_name="LearnerWorker",
        never_started=True,
    )
    line = error_line(ray.exceptions.ActorDiedError(context))
    assert line == (
        "The actor is dead because its owner has died. "
        "The actor never ran - it was cancelled before it started running."
    )


def test_a_constructor_exception_is_reported_as_its_own_last_line():
    err = ray.exceptions.ActorDiedError()
    assert error_line(err) == ray.exceptions.ActorDiedError.BASE_ERROR_MSG
    assert error_line(RuntimeError("first\nValueError: bad model path")) == "ValueError: bad model path"


class _RefusesItsSettings:
    def __init__(self):
        # As pydantic words a refused setting (vLLM's engine options, for one): the last line is a link.
        raise ValueError(
            "1 validation error for CompilationConfig\n"
            "cudagraph_capture_sizez\n"
            "  Unexpected keyword argument [type=unexpected_keyword_argument, input_value=[1, 2], input_type=list]\n"
            "    For further information visit https://errors.pydantic.dev/2.14/v/unexpected_keyword_argument"
        )

    def ready(self) -> bool:
        return True


def test_a_constructor_exception_of_several_lines_is_told_by_all_of_them_but_the_link(local_ray):
    from grpo_ray.cluster.placement import wait_ready
    from grpo_ray.errors import ClusterError

    actor = ray.remote(num_cpus=0)(_RefusesItsSettings).remote()
    with pytest.raises(ClusterError) as raised:
        wait_ready({"rollout-0": actor}, timeout_s=120)
    assert str(raised.value) == (
        "rollout-0 failed to start: ValueError: 1 validation error for CompilationConfig; cudagraph_capture_sizez; "
        "Unexpected keyword argument [type=unexpected_keyword_argument, input_value=[1, 2], input_type=list]"
    )
