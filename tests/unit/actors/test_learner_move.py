"""update/moved (actors/learner_forward.moved_by_update): a learner's step reports how far its update moved
the log-probs of the tokens it trained on, as the weights before and after it score them.

The tiny model's learner takes one step on 8 rows (every other one right-padded: the rows scored again
are trimmed to their own width) in one micro-batch, so the rows it scores again are all 8; the test
scores the whole batch before and after with the learner's own `score` and works out the same figures.
The rows of a group share its prompt, as GRPO's do, so the update runs each prompt once
(models/shared_prompts.py) through DeepSpeed's engine, as a run's learner does.
The learner runs in a process of its own (DeepSpeed keeps one process group a process).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_ray.algo.policy_move import update_move

from ...conftest import tiny_learner_settings
from ...gpu.test_cuda_paths import PROMPT, ROWS, _batch, whole_batch_shard


def test_a_learner_step_reports_how_far_it_moved_the_tokens_it_trained_on(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "tests.unit.actors.test_learner_move", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    before, after = (torch.tensor(report[key], dtype=torch.float64) for key in ("before", "after"))
    mask = torch.tensor(report["completion_mask"], dtype=torch.float64)
    expected = update_move(after, before, mask, clip_low=0.2, clip_high=0.28)
    assert expected["update/moved"] > 1e-3  # the step moved them: the comparison below means something
    for key, value in expected.items():
        assert report["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def _learner_step(out: Path) -> None:
    from grpo_ray.actors.learner import LearnerWorker
    from grpo_ray.transport.broadcast import free_port

    learner = LearnerWorker(tiny_learner_settings(micro_batch_size=ROWS), rank=0, world_size=1)
    learner.setup("127.0.0.1", free_port())
    batch = _batch(learner.module.config.vocab_size)
    batch.input_ids[:, :PROMPT] = batch.input_ids[batch.group_ids * 4, :PROMPT]  # groups of 4 rows
    scored = {}
    scored["before"] = learner.score(batch.input_ids, batch.attention_mask).tolist()
    shard = whole_batch_shard(batch, np.linspace(-1, 1, ROWS).astype(np.float32))
    metrics = learner.train_step(shard, batch).metrics
    scored["after"] = learner.score(batch.input_ids, batch.attention_mask).tolist()
    report = {**scored, "completion_mask": batch.completion_mask.tolist(), "metrics": metrics}
    (out / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    _learner_step(Path(sys.argv[1]))
