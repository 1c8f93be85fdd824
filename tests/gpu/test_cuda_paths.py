"""The learner, reference and hf rollout engine on a CUDA device give what the CPU computes.

Run on a GPU machine with `pytest -m gpu` (the hf engine's own tests in tests/unit/actors then
also run on the GPU). Skipped without CUDA.
"""

import numpy as np
import pytest
import torch

from grpo_ray.algo import behaviour_is_weights, grpo_loss
from grpo_ray.models.loading import load_causal_lm, load_named_weights, load_tokenizer, sequence_logprobs
from grpo_ray.models.tiny import ensure_tiny_artifacts
from grpo_ray.types import LearnerShard, RolloutSlice

from ..conftest import tiny_learner_settings

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROWS, PROMPT, COMPLETION = 8, 6, 10
LR = 1e-4


@pytest.fixture(scope="module")
def tiny_model_dir():
    # Full fp32 on the GPU, so CPU and GPU agree to rounding.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return str(ensure_tiny_artifacts().model_dir)


def _batch(vocab: int) -> RolloutSlice:
    rng = np.random.default_rng(0)
    width = PROMPT + COMPLETION
    attention = np.ones((ROWS, width), np.int64)
    attention[::2, -3:] = 0  # every other row ends early (right padding)
    completion = np.zeros((ROWS, width), np.float32)
    completion[:, PROMPT:] = attention[:, PROMPT:]
    return RolloutSlice(
        group_ids=np.arange(ROWS) // 4,
        prompt_uids=np.arange(ROWS) // 4,
        input_ids=rng.integers(1, vocab, (ROWS, width)).astype(np.int64) * attention,
        attention_mask=attention,
        completion_mask=completion,
        rollout_logprobs=(-rng.random((ROWS, width)) * completion).astype(np.float32),
        prompts=[""] * ROWS,
        completions=[""] * ROWS,
        answers=[""] * ROWS,
        finish_reasons=["stop"] * ROWS,
        row_fields={},
        policy_versions=np.zeros(ROWS, np.int64),
        group_diversity=np.full(ROWS, np.nan),
    )


def whole_batch_shard(
    batch: RolloutSlice, advantages: np.ndarray, temperature: float = 1.0, step: int = 1
) -> LearnerShard:
    """The shard of a one-rank learner that trains on all of `batch` (every row weighs 1)."""
    return LearnerShard(
        step=step,
        advantages=[advantages],
        row_weights=[np.ones(len(advantages), np.float32)],
        global_tokens=float(batch.completion_mask.sum()),
        global_sequences=len(advantages),
        temperature=temperature,
        norm_length=float(COMPLETION),
    )


def _cpu_step(model_dir, batch, advantages, lr):
    """The learner's loss and one AdamW step, computed on the CPU by hand."""
    model = load_causal_lm(model_dir, "float32")
    ids, mask = torch.from_numpy(batch.input_ids), torch.from_numpy(batch.attention_mask)
    logprobs, entropy = sequence_logprobs(model, ids, mask, 1.0, with_entropy=True)
    old = logprobs.detach()
    completion = torch.from_numpy(batch.completion_mask)
    weights = behaviour_is_weights(
        old, torch.from_numpy(batch.rollout_logprobs), torch.zeros(ROWS, dtype=torch.bool), 2.0, None
    )
    out = grpo_loss(
        logprobs=logprobs,
        old_logprobs=old,
        advantages=torch.from_numpy(advantages),
        mask=completion,
        clip_low=0.2,
        clip_high=0.28,
        entropy=entropy,
        is_weights=weights,
        aggregation="token-mean",
        global_tokens=float(completion.sum()),
        global_sequences=float(ROWS),
        norm_length=float(COMPLETION),
    )
    out.loss.backward()
    torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.0).step()
    return out.metrics["loss/total"], {
        name: p.detach().numpy() for name, p in model.named_parameters(remove_duplicate=False)
    }


def test_learner_step_on_cuda_matches_the_cpu_computation(tiny_model_dir):
    from grpo_ray.actors.learner import LearnerWorker
    from grpo_ray.transport.broadcast import free_port

    settings = tiny_learner_settings(micro_batch_size=ROWS, lr=LR, grad_clip=1e9)
    learner = LearnerWorker(settings, rank=0, world_size=1)
    learner.setup("127.0.0.1", free_port())
    assert learner.engine.device.type == "cuda"
    batch = _batch(learner.module.config.vocab_size)
    advantages = np.linspace(-1, 1, ROWS).astype(np.float32)
    shard = whole_batch_shard(batch, advantages)
    stats = learner.train_step(shard, batch)

    loss, cpu_after = _cpu_step(tiny_model_dir, batch, advantages, LR)
    assert stats.metrics["loss/total"] == pytest.approx(loss, rel=1e-4, abs=1e-6)
    assert stats.num_tokens == int(batch.attention_mask.sum())
    # AdamW's first step moves each weight by ~lr * sign(gradient): the same signs, the same step.
    after = learner.parameters_snapshot()
    diffs = np.concatenate([np.abs(after[name] - cpu_after[name]).ravel() for name in after])
    assert diffs.max() <= 2.5 * LR
    assert (diffs < 0.05 * LR).mean() > 0.999

    # The updated weights come back to the host, and score() agrees with a CPU model holding them.
    cpu_model = load_causal_lm(tiny_model_dir, "float32")
    load_named_weights(cpu_model, ((name, torch.from_numpy(value)) for name, value in after.items()))
    expected, _ = sequence_logprobs(
        cpu_model, torch.from_numpy(batch.input_ids), torch.from_numpy(batch.attention_mask)
    )
    scored = learner.score(batch.input_ids, batch.attention_mask)
    assert isinstance(scored, np.ndarray)
    np.testing.assert_allclose(scored, expected.detach().numpy(), atol=1e-4)


def test_reference_logprobs_on_cuda_match_the_cpu(tiny_model_dir):
    from grpo_ray.actors.reference import ReferenceWorker

    reference = ReferenceWorker(tiny_model_dir, "float32", micro_batch_size=3)
    assert next(reference.model.parameters()).device.type == "cuda"
    batch = _batch(reference.model.config.vocab_size)
    got = reference.logprobs(batch, temperature=0.8)
    cpu_model = load_causal_lm(tiny_model_dir, "float32")
    expected, _ = sequence_logprobs(
        cpu_model, torch.from_numpy(batch.input_ids), torch.from_numpy(batch.attention_mask), 0.8
    )
    np.testing.assert_allclose(got, expected.detach().numpy() * batch.completion_mask, atol=1e-4)


def test_hf_engine_generates_on_cuda(tiny_model_dir):
    from grpo_ray.actors.hf_engine import HFEngine
    from grpo_ray.types import SamplingSettings

    engine = HFEngine(tiny_model_dir, load_tokenizer(tiny_model_dir))
    assert engine.device.type == "cuda"
    groups = engine.generate(
        [(5, 6, 7), (8, 9)], SamplingSettings(samples_per_prompt=3, max_new_tokens=4, temperature=1.0)
    )
    assert [len(group) for group in groups] == [3, 3]
    assert all(len(c.token_ids) == len(c.logprobs) >= 1 for group in groups for c in group)


def test_device_identity_names_the_gpu_and_two_ranks_on_it_fall_back_to_gloo():
    from grpo_ray.transport.broadcast import choose_backend, device_identity

    identity = device_identity()
    assert identity and identity == device_identity()
    # A learner and a rollout worker given the same GPU (colocated, or 0.5 GPU each on one card).
    assert choose_backend([identity, identity])[0] == "gloo"


def _gpu_receiver(port, specs, buckets, queue):
    from grpo_ray.transport.broadcast import (
        BroadcastGroup,
        ReceiveTally,
        choose_backend,
        device_identity,
        receive_buckets,
    )

    backend, _ = choose_backend([queue.get(timeout=60), device_identity()])
    group = BroadcastGroup.join("127.0.0.1", port, 1, 2, backend, 60)
    tally = ReceiveTally()
    model = {spec.name: torch.zeros(spec.shape, device="cuda") for spec in specs}
    for name, tensor in receive_buckets(group, specs, buckets, tally):
        model[name].copy_(tensor)
    queue.put((backend, {name: t.cpu() for name, t in model.items()}, tally.checksum))


def test_two_processes_on_one_gpu_sync_weights_through_gloo():
    """A learner and a rollout worker sharing the one GPU: NCCL would refuse the pair."""
    import multiprocessing as mp

    from grpo_ray.transport.broadcast import (
        BroadcastGroup,
        choose_backend,
        device_identity,
        free_port,
        plan_buckets,
        send_buckets,
    )
    from grpo_ray.types import WeightSpec

    torch.manual_seed(0)
    tensors = [torch.randn(64, 32, device="cuda"), torch.randn(100, device="cuda")]
    specs = [WeightSpec(f"w{i}", tuple(t.shape), "float32") for i, t in enumerate(tensors)]
    buckets = plan_buckets(specs, 4096)
    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_gpu_receiver, args=(port, specs, buckets, queue))
    child.start()
    queue.put(device_identity())
    backend, why = choose_backend([device_identity(), device_identity()])
    assert backend == "gloo", why
    group = BroadcastGroup.join("127.0.0.1", port, 0, 2, backend, 60)
    checksum, _ = send_buckets(group, tensors, specs, buckets)
    child_backend, received, child_checksum = queue.get(timeout=60)
    child.join(timeout=30)
    assert child_backend == "gloo" and child_checksum == checksum
    for i, tensor in enumerate(tensors):
        torch.testing.assert_close(received[f"w{i}"], tensor.cpu(), rtol=0, atol=0)
