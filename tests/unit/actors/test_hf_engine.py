"""The hf backend's sampling log-probs, against the model's own log-probs of the same tokens."""

import numpy as np
import pytest
import torch

from grpo_ray.actors.hf_engine import HFEngine
from grpo_ray.models.loading import load_tokenizer, sequence_logprobs
from grpo_ray.models.tiny import ensure_tiny_artifacts
from grpo_ray.types import SamplingSettings

PROMPTS = [(5, 6, 7), (8, 9), (10, 11, 12, 13)]


@pytest.fixture(scope="module")
def engine():
    path = ensure_tiny_artifacts().model_dir
    return HFEngine(str(path), load_tokenizer(str(path)))


def _model_logprobs(engine, prompt, completion, temperature):
    ids = torch.tensor([list(prompt) + list(completion.token_ids)])
    logprobs, _ = sequence_logprobs(engine.model, ids, torch.ones_like(ids), temperature)
    return logprobs[0, len(prompt) :].detach().cpu().numpy()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_are_the_tempered_model_logprobs(engine, temperature):
    sampling = SamplingSettings(samples_per_prompt=4, max_new_tokens=6, temperature=temperature, seed=3)
    groups = engine.generate(PROMPTS, sampling)
    assert [len(g) for g in groups] == [4, 4, 4]
    for prompt, group in zip(PROMPTS, groups):
        for completion in group:
            assert 1 <= len(completion.token_ids) == len(completion.logprobs) <= 6
            expected = _model_logprobs(engine, prompt, completion, temperature)
            np.testing.assert_allclose(completion.logprobs, expected, atol=1e-4)


def test_top_k_one_draws_the_greedy_token_with_probability_one(engine):
    greedy = engine.generate(PROMPTS, SamplingSettings(samples_per_prompt=1, max_new_tokens=5, temperature=0.0))
    top1 = engine.generate(
        PROMPTS, SamplingSettings(samples_per_prompt=2, max_new_tokens=5, temperature=1.3, top_k=1, seed=9)
    )
    for greedy_group, top1_group in zip(greedy, top1):
        for completion in top1_group:
            assert completion.token_ids == greedy_group[0].token_ids
            assert np.allclose(completion.logprobs, 0.0, atol=1e-6)


def test_greedy_reports_the_raw_model_logprob(engine):
    groups = engine.generate(PROMPTS, SamplingSettings(samples_per_prompt=1, max_new_tokens=5, temperature=0.0))
    for prompt, (completion,) in zip(PROMPTS, groups):
        np.testing.assert_allclose(completion.logprobs, _model_logprobs(engine, prompt, completion, 1.0), atol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 1.5])
def test_prompts_prefilled_once_for_their_samples_draw_what_a_prefill_per_sample_draws(engine, temperature):
    # G samples of a prompt share one prefill of it (its cache repeated G times). Each prompt
    # written out G times with one sample each is prefilled once per row: with the same seed
    # the sampler sees the same rows in the same order, so every token must agree.
    g = 4
    shared = engine.generate(
        PROMPTS, SamplingSettings(samples_per_prompt=g, max_new_tokens=6, temperature=temperature, seed=5)
    )
    repeated = [p for p in PROMPTS for _ in range(g)]
    per_row = engine.generate(
        repeated, SamplingSettings(samples_per_prompt=1, max_new_tokens=6, temperature=temperature, seed=5)
    )
    flat = [c for group in shared for c in group]
    assert [c.token_ids for c in flat] == [group[0].token_ids for group in per_row]
    assert len({c.token_ids for c in flat}) > len(PROMPTS), "the samples of a prompt must differ"
    for c, (row,) in zip(flat, per_row):
        np.testing.assert_allclose(c.logprobs, row.logprobs, atol=1e-5)


def test_a_fixed_seed_gives_the_same_samples_and_another_seed_others(engine):
    def run(seed):
        sampling = SamplingSettings(samples_per_prompt=4, max_new_tokens=6, temperature=1.0, seed=seed)
        return [(c.token_ids, c.logprobs) for group in engine.generate(PROMPTS, sampling) for c in group]

    first = run(11)
    assert run(11) == first
    assert [ids for ids, _ in run(12)] != [ids for ids, _ in first]
