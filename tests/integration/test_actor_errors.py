"""The one line a run prints when an actor dies says why Ray says it died."""

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
