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


def test_per_turn_credit_takes_what_earlier_steps_earned_off_each_turns_advantage():
    from grpo_ray.actors.episodes import Episode, episode_sample
    from grpo_ray.actors.slices import pack_samples
    from grpo_ray.actors.learner_batch import concat_rows, turn_credit_moved
    from grpo_ray.envs.episode import EpisodeTokens
    from grpo_ray.types import Prompt

    # prompt [1, 2], turn 1 [3, 4], reply [5], turn 2 [6]: the step after turn 1 earned 0.5.
    tokens = EpisodeTokens(prompt=[1, 2])
    tokens.add_turn([3, 4], [-0.1, -0.2], earned_before=0.0)
    tokens.add_reply([5])
    tokens.add_turn([6], [-0.3], earned_before=0.5)
    prompt = Prompt(uid=7, text="q", token_ids=(1, 2), answer="a", fields={})
    row = (0, prompt, episode_sample(Episode(tokens)))
    # environment.reward_weight 2: the credit is the weighted reward.
    credited = pack_samples([row], pad_id=0, policy_version=0, diversity={0: 1.0}, turn_credit=2.0)
    assert credited.reward_before.tolist() == [[0, 0, 0, 0, 0, 1.0]]
    assert pack_samples([row], 0, 0, {0: 1.0}).reward_before is None  # per-episode by default
    batch = concat_rows([credited], [np.array([0.8])], [np.ones(1)], None, 0, slopes=[np.array([0.25])])
    # Turn 1 (and the masked reply) keeps the row's advantage; turn 2 loses slope x credit = 0.25 x 1.0.
    assert np.allclose(batch["advantages"][0, 2:].numpy(), [0.8, 0.8, 0.8, 0.55])
    # The mean change over the model's 3 tokens: 0.25 / 3; the metric leaves the batch.
    assert abs(turn_credit_moved(batch) - 0.25 / 3) < 1e-7 and "turn_credit" not in batch
    plain = concat_rows([credited], [np.array([0.8])], [np.ones(1)], None, 0)
    assert np.allclose(plain["advantages"].numpy(), [0.8]) and turn_credit_moved(plain) is None


def test_a_payload_carries_its_slices_then_reference_then_each_teachers_arrays():
    from grpo_ray.actors.learner_batch import split_payload

    slices, refs, teachers = split_payload(("s0", "s1", "r0", "r1", "a0", "a1", "b0", "b1"), 2, 2)
    assert (slices, refs, teachers) == (["s0", "s1"], ["r0", "r1"], [["a0", "a1"], ["b0", "b1"]])
    assert split_payload(("s0", "a0"), 1, 1) == (["s0"], None, [["a0"]])
    assert split_payload(("s0", "r0"), 1, 0) == (["s0"], ["r0"], None)


def taught(batch, first_pass, coef, stale=None):
    """The advantages the learner trains a whole batch on (as one micro-batch), given its first pass."""
    from grpo_ray.actors.learner_batch import taught_advantages

    rows = len(batch["advantages"])
    batch["stale"] = torch.zeros(rows, dtype=torch.bool) if stale is None else torch.tensor(stale)
    return taught_advantages(batch, torch.tensor(first_pass, dtype=torch.float32), coef).tolist()


def test_each_slices_rows_take_their_teachers_signal():
    from grpo_ray.actors.learner_batch import concat_rows
    from grpo_ray.actors.slices import pack_slice
    from grpo_ray.types import Completion, Prompt

    prompt = Prompt(uid=0, text="q", token_ids=(1, 2), answer="a")
    completion = Completion(token_ids=(5, 6), logprobs=(-1.0, -2.0), text="x", finish_reason="stop")
    one, two = pack_slice([(0, prompt, completion)], 0, 0), pack_slice([(1, prompt, completion)], 0, 0)
    nan = float("nan")
    # Teacher a teaches slice one's row, teacher b slice two's.
    a = [np.array([[0, 0, -0.5, -3.0]], np.float32), np.full((1, 4), nan, np.float32)]
    b = [np.full((1, 4), nan, np.float32), np.array([[0, 0, -2.0, -1.0]], np.float32)]
    ones = [np.ones(1), np.ones(1)]
    batch = concat_rows([one, two], [np.array([0.25]), np.array([0.0])], ones, None, 0, teachers=[a, b])
    assert batch["taught_by"].tolist() == [0, 1]
    assert batch["advantages"].tolist() == [0.25, 0.0]  # the term waits for the learner's first pass
    # The learner's own log-probs of the sampled tokens (not the rollout's -1 and -2): -1.25 and -1.5
    # on both rows. Gaps row 0: -1.25 - (-0.5) = -0.75 and -1.5 - (-3) = 1.5; row 1: 0.75 and -0.5.
    first_pass = [[0, 0, -1.25, -1.5], [0, 0, -1.25, -1.5]]
    assert taught(batch, first_pass, 0.5) == [[0.25, 0.25, 0.625, -0.5], [0.0, 0.0, -0.375, 0.25]]


def test_an_environments_reply_takes_no_teacher_term():
    from grpo_ray.actors.episodes import Episode, episode_sample
    from grpo_ray.actors.learner_batch import concat_rows, taught_sums
    from grpo_ray.actors.slices import pack_samples
    from grpo_ray.algo.distill import StudentSums, teacher_sums
    from grpo_ray.envs.episode import EpisodeTokens
    from grpo_ray.types import Prompt

    # An episode: prompt [1, 2], the model's turn [3, 4], the environment's reply [5], its turn [6].
    tokens = EpisodeTokens(prompt=[1, 2])
    tokens.add_turn([3, 4], [-0.25, -0.5])
    tokens.add_reply([5])
    tokens.add_turn([6], [-0.75])
    prompt = Prompt(uid=7, text="q", token_ids=(1, 2), answer="a", fields={})
    episode = pack_samples([(0, prompt, episode_sample(Episode(tokens)))], pad_id=0, policy_version=0)
    # A teacher's log-prob at every column, the prompt's and the reply's too: only the model's three
    # tokens take its signal.
    teacher = np.array([[-8.0, -8.0, -0.75, -0.5, -8.0, -1.75]], np.float32)
    batch = concat_rows([episode], [np.array([0.5])], [np.ones(1)], None, 0, teachers=[[teacher]])
    # The learner's first pass agrees with the rollout here: -0.25, -0.5, -0.75 on the model's tokens.
    first_pass = [[-9.0, -9.0, -0.25, -0.5, -9.0, -0.75]]
    # Turn 1: 0.5 - (-0.25 + 0.75) = 0 and 0.5 - 0 = 0.5; turn 2: 0.5 - (-0.75 + 1.75) = -0.5.
    # The prompt and the reply keep the row's 0.5, though the teacher gave them -8.
    assert taught(batch, first_pass, 1.0) == [[0.5, 0.5, 0.0, 0.5, 0.5, -0.5]]
    # Its metrics count the same three tokens: teacher -3, student -1.5, gaps 0.5 + 0 + 1.
    sums = teacher_sums(teacher * episode.completion_mask, episode.completion_mask)
    assert (sums.tokens, sums.rows, sums.teacher_logprob) == (3, 1, -3.0)
    student = taught_sums(batch, torch.tensor(first_pass), ("t",))
    assert student == {"t": StudentSums(reverse_kl=1.5, student_logprob=-1.5, tokens=3)}


def test_the_teachers_gap_is_to_the_weights_that_sampled_the_row():
    from grpo_ray.actors.learner_batch import concat_rows, split_payload
    from grpo_ray.actors.slices import pack_slice
    from grpo_ray.types import Completion, Prompt

    # A row sampled by weights version 2 (their log-probs -1 and -2 recorded with it), with the KL
    # term's reference log-probs in the payload before the teacher's, as train_step receives them.
    prompt = Prompt(uid=0, text="q", token_ids=(1, 2), answer="a")
    completion = Completion(token_ids=(5, 6), logprobs=(-1.0, -2.0), text="x", finish_reason="stop")
    row = pack_slice([(0, prompt, completion)], pad_id=0, policy_version=2)
    reference = np.array([[0, 0, -4.0, -4.0]], np.float32)
    teacher = np.array([[0, 0, -1.5, -1.0]], np.float32)
    slices, refs, teachers = split_payload((row, reference, teacher), 1, 1)
    batch = concat_rows(slices, [np.array([0.25])], [np.ones(1)], refs, 0, teachers=teachers)
    assert batch["ref_logprobs"].tolist() == reference.tolist()
    # The learner's first pass gives -1.25 and -3.0. Trained at the step after the one that sampled
    # it (on-policy), its weights are the ones that sampled it: the gaps are its own, -1.25 - (-1.5)
    # = 0.25 and -3 - (-1) = -2, however the rollout engine's kernels rounded them.
    first_pass = [[0, 0, -1.25, -3.0]]
    assert taught(batch, first_pass, 1.0) == [[0.25, 0.25, 0.0, 2.25]]
    # Trained later (pipelined: stale), the learner no longer holds those weights: the gaps are the
    # rollout's record against the teacher, -1 - (-1.5) = 0.5 and -2 - (-1) = -1: 0.25 - 0.5, 0.25 + 1.
    assert taught(batch, first_pass, 1.0, stale=[True]) == [[0.25, 0.25, -0.25, 1.25]]
