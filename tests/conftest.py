"""Test-wide settings: one torch thread, passive OpenMP, a project-local cache for the tiny model."""

import os
from pathlib import Path

# Before torch is imported by any test module (see cluster/session.py for why).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
# The tiny model is built once per checkout and shared by every test and actor.
os.environ.setdefault("GRPO_RAY_CACHE", str(Path(__file__).resolve().parents[1] / ".cache" / "grpo-ray"))

import torch  # noqa: E402

torch.set_num_threads(1)

# Qwen2's real vocabulary: the log-prob tests' random models have it, so that the head is as wide as a real one.
QWEN2_VOCAB = 151_936


def tiny_learner_settings(**overrides):
    """The LearnerSettings of one tiny-model learner rank, as the tests build it: float32, ZeRO-0,
    plain GRPO (clip 0.2 / 0.28, no KL, no entropy bonus, token-mean), AdamW at lr 1e-3 without
    weight decay, micro-batches of 4; `overrides` are what a test sets otherwise (any field)."""
    from dataclasses import replace

    from grpo_ray.actors.learner_settings import LearnerSettings
    from grpo_ray.models.tiny import ensure_tiny_artifacts

    model_dir = str(ensure_tiny_artifacts().model_dir)
    settings = LearnerSettings(
        model_path=model_dir,
        tokenizer_path=model_dir,
        dtype="float32",
        seed=0,
        zero_stage=0,
        micro_batch_size=4,
        grad_accum_steps=1,
        lr=1e-3,
        weight_decay=0.0,
        betas=(0.9, 0.999),
        grad_clip=1.0,
        torch_threads=1,
        clip_low=0.2,
        clip_high=0.28,
        kl_coef=0.0,
        kl_estimator="k3",
        entropy_coef=0.0,
        loss_aggregation="token-mean",
    )
    return replace(settings, **overrides)


def random_qwen2(**overrides):
    """A randomly initialised Qwen2 (seed 0) with the real vocabulary, float32: 1 layer, 32 wide,
    an untied LM head unless `overrides` (Qwen2Config's fields) say otherwise."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    shape = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=QWEN2_VOCAB, **{**shape, **overrides})).float()


def tiny_heldout_eval(output_dir, **overrides):
    """The EvalSettings of `grpo-ray eval --model tiny --data tiny:heldout --reward exact_match
    --max-tokens 4`, greedy, one sample a prompt (the build records its accuracy), logged under
    `output_dir`; `overrides` are what a test sets otherwise."""
    from grpo_ray.commands.evaluate import EvalSettings

    shape = dict(n=1, temperature=0.0, max_tokens=4, reward="exact_match")
    return EvalSettings(model="tiny", data=("tiny:heldout",), output_dir=str(output_dir), **{**shape, **overrides})
