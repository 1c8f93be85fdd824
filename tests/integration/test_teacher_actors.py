"""Teachers as actors (distillation.teachers): started through the cluster's Workers from a recipe,
each scores the rows of its own data sources with the reference's forward, and one that dies while
its calls are in flight is restarted by Ray and asked again, the phase ending with the same numbers.

One local Ray, two teachers on the tiny model (one for gsm8k rows, one for math rows), two learner
ranks of two packed slices each.
"""

import os
import time

import numpy as np
import pytest

from grpo_ray.actors.reference import ReferenceWorker
from grpo_ray.actors.slices import pack_slice
from grpo_ray.cluster.placement import reserve, wait_ready
from grpo_ray.cluster.recovery import WorkerRecovery
from grpo_ray.cluster.roles import Workers, start_teachers
from grpo_ray.cluster.settings import teacher_settings
from grpo_ray.config import config_from_dict, plan_batches, plan_resources
from grpo_ray.models.loading import load_tokenizer
from grpo_ray.algo.distill import TeacherSums
from grpo_ray.types import Completion, Prompt

SOURCES = ["gsm8k", "math", "other"]  # "other": a row no teacher teaches


@pytest.fixture(scope="module")
def teachers(local_ray):
    cfg = config_from_dict(
        {
            "distillation": {
                "teachers": [
                    {"name": "gsm", "model_path": "tiny", "sources": ["gsm8k"]},
                    {"name": "maths", "model_path": "tiny", "sources": ["math"]},
                ]
            },
            "learner": {"packing": True, "micro_batch_size": 4},
            "ray": {"max_actor_restarts": 1},
        }
    )
    plan = plan_batches(cfg)
    roles = {role.role: role for role in plan_resources(cfg) if role.role.startswith("teacher-")}
    placement = reserve(list(roles.values()), 60)
    workers = Workers(
        placement,
        [],
        [],
        [],
        None,
        teachers=start_teachers(cfg, plan, placement, roles),
        teacher_names=["gsm", "maths"],
    )
    try:
        wait_ready(workers.all(), timeout_s=120)
        yield cfg, plan, workers
    finally:
        workers.stop()


def packed_slices(ray, seed: int) -> tuple[list[list], list]:
    """Two ranks of two slices each, 6 rows a slice with sources in turn; (their refs, the slices)."""
    tokenizer = load_tokenizer("tiny")
    rng = np.random.default_rng(seed)
    payloads, slices = [], []
    for rank in range(2):
        refs = []
        for s in range(2):
            rows = []
            for i in range(6):
                text = f"{rng.integers(10, 99)}+{rng.integers(10, 99)}="
                prompt = Prompt(i, text, tuple(tokenizer(text)["input_ids"]), "0", {"data_source": SOURCES[i % 3]})
                ids = tuple(int(t) for t in rng.integers(0, 40, size=int(rng.integers(2, 8))))
                completion = Completion(ids, tuple(float(x) for x in -rng.random(len(ids))), "x", "stop")
                rows.append((i // 2, prompt, completion))
            batch = pack_slice(rows, int(tokenizer.pad_token_id), policy_version=0)
            slices.append(batch)
            refs.append(ray.put(batch))
        payloads.append(refs)
    return payloads, slices


def test_teachers_score_their_sources_with_the_references_numbers(local_ray, teachers):
    cfg, plan, workers = teachers
    assert list(workers.all()) == ["teacher-gsm", "teacher-maths"]
    payloads, slices = packed_slices(local_ray, seed=0)
    logprobs, sums = workers.teacher_logprobs(payloads, temperature=1.0)
    # Ranks x teachers x slices, and each teacher's sums in payload order (rank 0's slices, then rank 1's).
    assert [[len(per_teacher) for per_teacher in rank] for rank in logprobs] == [[2, 2], [2, 2]]
    assert list(sums) == ["gsm", "maths"] and [len(parts) for parts in sums.values()] == [4, 4]
    s = teacher_settings(cfg, plan, 0)
    reference = ReferenceWorker(
        "tiny", "float32", s.micro_batch_size, s.torch_threads, s.chunk_tokens, s.packing, s.max_tokens_per_micro_batch
    )
    assert s.packing and s.sources == ("gsm8k",) and s.source_field == "data_source"
    for rank in range(2):
        for k in range(2):
            batch = slices[2 * rank + k]
            for t, source in enumerate(["gsm8k", "math"]):
                got = local_ray.get(logprobs[rank][t][k])
                taught = np.array([value == source for value in batch.row_fields["data_source"]])
                assert got.shape == batch.input_ids.shape and got.dtype == np.float32
                # The reference's forward over the same rows (micro-batches of other rows round otherwise).
                expected = reference.logprobs(batch.select(np.flatnonzero(taught)), 1.0)
                np.testing.assert_array_equal(got[taught], expected)
                assert np.isnan(got[~taught]).all()
                part = local_ray.get(sums[["gsm", "maths"][t]][2 * rank + k])
                assert isinstance(part, TeacherSums) and part.rows == 2
                assert part.tokens == int(batch.completion_mask[taught].sum())


def test_a_teacher_that_dies_mid_call_is_restarted_and_asked_again(local_ray, teachers):
    _, _, workers = teachers
    payloads, _ = packed_slices(local_ray, seed=1)
    unhurt, unhurt_sums = workers.teacher_logprobs(payloads, temperature=1.0)
    logs: list[str] = []
    recovery = WorkerRecovery(
        [], [], resync=lambda: None, max_restarts=1, log=logs.append, teachers=workers.named_teachers()
    )

    def exit_soon(_self):  # ends the actor's process while the calls queued behind it wait
        time.sleep(1.0)
        os._exit(1)

    workers.teachers[1].__ray_call__.remote(exit_soon)
    hurt, hurt_sums = workers.teacher_logprobs(payloads, temperature=1.0, recovery=recovery)
    for rank in range(2):
        for t in range(2):
            for k in range(2):
                np.testing.assert_array_equal(local_ray.get(hurt[rank][t][k]), local_ray.get(unhurt[rank][t][k]))
    assert local_ray.get(hurt_sums["maths"]) == local_ray.get(unhurt_sums["maths"])
    assert recovery.counters()["faults/teacher_replaced"] == 1
    assert any(line.startswith("teacher-maths died and was replaced") for line in logs), logs
    assert "re-issued teacher-maths's 4 log-prob calls" in logs
