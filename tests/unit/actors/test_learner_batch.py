"""A rank's rows cut into micro-batches: the rows a plan names, padding trimmed, and the weight-0
row of an empty micro-batch."""

import numpy as np
import torch

from grpo_ray.actors.learner_batch import micro_batch


def _batch():
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    return {
        "input_ids": torch.arange(15).view(3, 5) * mask,
        "attention_mask": mask,
        "completion_mask": mask[:, :].float(),
        "advantages": torch.tensor([0.5, -1.0, 2.0]),
        "row_weights": torch.ones(3),
    }


def test_the_plans_rows_in_its_order_with_padding_trimmed():
    mb = micro_batch(_batch(), np.array([2, 0]), "cpu")
    assert mb["input_ids"].tolist() == [[10, 11, 12, 13], [0, 1, 2, 0]]  # 4 wide: row 2's length
    assert mb["advantages"].tolist() == [2.0, 0.5] and mb["row_weights"].tolist() == [1.0, 1.0]


def test_an_empty_micro_batch_is_the_first_row_at_weight_zero():
    mb = micro_batch(_batch(), np.array([], dtype=np.int64), "cpu")
    assert mb["input_ids"].tolist() == [[0, 1, 2]] and mb["row_weights"].tolist() == [0.0]
