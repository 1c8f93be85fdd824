"""What a rollout worker tells the driver when its engine dies: the root cause read from the engine's
log (hand-written logs of the shape vLLM writes), carried whole through pickling."""

import pickle

from grpo_ray.actors.worker_errors import EngineDiedError, engine_died, log_size, root_cause

BEFORE = """INFO 2026-11-27 04:58:24,291 EngineCore [core.py:402] init engine took 0.10 s
ERROR 2026-11-27 04:58:25,000 VllmWorker-0 [multiproc_executor.py:1063] WorkerProc hit an exception.
Traceback (most recent call last):
  File "gpu_model_runner.py", line 3502, in _bookkeeping_sync
OSError: an earlier engine's death, before this engine started
"""
CRASH = """INFO 2026-11-27 04:58:26,000 EngineCore [core.py:402] init engine took 0.10 s
ERROR 2026-11-27 04:58:26,224 VllmWorker-0 [multiproc_executor.py:1063] WorkerProc hit an exception.
Traceback (most recent call last):
  File "gpu_model_runner.py", line 3502, in _bookkeeping_sync
    gen.set_offset(gen.get_offset() - 4)
                   ^^^^^^^^^^^^^^^^
RuntimeError: CPU Generator does not use offset
ERROR 2026-11-27 04:58:26,225 EngineCore [core.py:1512] EngineCore encountered a fatal error.
Traceback (most recent call last):
  File "multiproc_executor.py", line 444, in get_response
    raise RuntimeError(
RuntimeError: Worker failed with error 'CPU Generator does not use offset', please check the stack trace above
vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
"""


def test_the_root_cause_is_the_first_exception_since_the_engine_started(tmp_path):
    log = tmp_path / "vllm-rollout-0.log"
    log.write_text(BEFORE)
    start = log_size(str(log))
    with log.open("a") as f:
        f.write(CRASH)
    # The worker's own exception, not the engine core's wrapper of it, nor the earlier engine's death.
    assert root_cause(str(log), start) == "RuntimeError: CPU Generator does not use offset"
    assert root_cause(str(log), 0) == "OSError: an earlier engine's death, before this engine started"
    assert root_cause(str(log), log_size(str(log))) is None and root_cause(None, 0) is None
    assert log_size(str(tmp_path / "none.log")) == 0


def test_a_death_without_a_log_line_names_the_error_it_raised_and_survives_pickling(tmp_path):
    died = engine_died(2, None, 0, 5, RuntimeError("EngineCore encountered an issue.\nsee above"))
    assert str(died) == "rollout-2: its vLLM engine died: RuntimeError (EngineCore encountered an issue.)"
    again = pickle.loads(pickle.dumps(EngineDiedError(1, "RuntimeError: x", "/runs/logs/vllm-rollout-1.log", 0)))
    assert (again.index, again.reason, again.log_file, again.sampled) == (
        1,
        "RuntimeError: x",
        "/runs/logs/vllm-rollout-1.log",
        0,
    )
    assert str(again).endswith("; the engine's log: /runs/logs/vllm-rollout-1.log")
