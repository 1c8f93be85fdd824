"""The second built-in real family, Gemma 3 270M (models/gemma3.py), a base model, on both engines: what
SmolLM2 cannot show (tests/integration/test_real_model.py). Each run is its recipe shrunk to two steps
of 1 prompt x 8 samples, evaluated on 16 held-out problems at steps 0 and 2.

- Its prompts are plain text after the <bos> its tokenizer adds (restored in the build), on both
  engines: greedy, the hf and vllm runs score the same at step 0, and `validate` shows the <bos>.
- vllm, full fine-tuning: the engine's log-probs equal the learner's within 1e-4 before and after an
  update (each step's mismatch; the prompts are 51 tokens, so the sliding-window layers' window of
  512 is not reached here: tests/unit/models/test_chunked_logprobs.py runs a window shorter than the
  rows), the probe decides at every sync, the tied 262,144 x 640 embedding travels once (1,072 MB a
  sync, not 1,744), a resume from step 1 makes step 2 and the final weights exactly again, and the
  saved model loads in transformers and scores in `grpo-ray eval` what the run's last evaluation did.
- hf, LoRA: only the adapter travels, and the engine samples from the learner's policy (1e-4).
The hf engine's LoRA run with the step-0 comparison of the engines, the resume and the saved model's
tests (~5 min on 2 cores) run in scripts/check_newest.sh and by hand, not in CI, where SmolLM2's (the
same code, no family in it) run: scripts/test.sh says so.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from .conftest import HAS_VLLM, assert_resume_remakes_step_two, run_cli, run_metrics, train_recipe
from .test_real_model import NOISE

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "gemma3-arithmetic.yaml"
# A user's own dense reward beside the accuracy, so that every group's rewards differ (the model is right
# 14% of the time greedily, and its completions are alike in length: with first_number alone, or a
# length reward, a step could hold nothing to learn, and "after an update" would test nothing).
CLOSENESS = """
import re


def closeness(completions, answers, **_):
    numbers = [re.findall(r"-?\\d+", c) for c in completions]
    return [1 / (1 + abs(int(n[0]) - int(a))) if n else 0.0 for n, a in zip(numbers, answers)]
"""
SHORT = [
    "train.steps=2",
    "train.prompts_per_step=1",
    "rollout.samples_per_prompt=8",
    "learner.micro_batch_size=8",
    "learner.lr=1e-5",
    "train.eval_every=2",
    "data.eval_limit=16",
    "train.checkpoint_every=1",
    "weight_sync.probe_every=1",
]


# 268,098,176 float32 parameters, the tied head among them once: 1,072.39 MB.
MODEL_MB = 1072.39


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory) -> Path:
    """One file for every run of the module: a resumed run must name the same reward as its first."""
    path = tmp_path_factory.mktemp("reward") / "closeness.py"
    path.write_text(CLOSENESS)
    return path


def train(output_dir: Path, reward: Path, *extra: str) -> str:
    functions = f"reward.functions=[{{name: first_number}}, {{name: {reward}:closeness}}]"
    return train_recipe(RECIPE, [f"output_dir={output_dir}", *SHORT, functions, *extra])


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory, reward_file):
    if not HAS_VLLM:
        pytest.skip("vllm is not installed")
    out = tmp_path_factory.mktemp("gemma3") / "vllm"
    return out, train(out, reward_file, "rollout.backend=vllm")


@pytest.fixture(scope="module")
def hf_lora_run(tmp_path_factory, reward_file):
    out = tmp_path_factory.mktemp("gemma3") / "hf-lora"
    return out, train(
        out, reward_file, "rollout.backend=hf", "model.lora={enabled: true, rank: 8, alpha: 16}", "learner.lr=1e-4"
    )


def test_the_restored_tokenizer_puts_bos_before_each_prompt_and_validate_shows_it():
    from grpo_ray.models.loading import load_tokenizer

    tokenizer = load_tokenizer("gemma3-270m")
    assert tokenizer("Question:")["input_ids"][0] == tokenizer.bos_token_id == 2
    done = run_cli("validate", str(RECIPE))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "(51 tokens, special tokens shown)\n| <bos>Question: What is 23 + 4?\n| Answer: 27\n" in done.stdout


@pytest.mark.vllm
def test_both_engines_see_the_same_prompts_and_score_alike_before_training(vllm_run, hf_lora_run):
    # Greedy on the same 16 held-out prompts, step 0: the same weights and tokens, so the same score.
    step0 = [run_metrics(out)["eval/accuracy"][0] for out, _ in (vllm_run, hf_lora_run)]
    assert step0[0] == step0[1], step0


@pytest.mark.vllm
def test_gemma_trains_on_vllm_with_the_learners_log_probs_and_its_tied_embedding_sent_once(vllm_run):
    out, console = vllm_run
    found = run_metrics(out)
    assert len(found["loss/total"]) == 2 and all(abs(v) > 0 for v in found["loss/total"]), found["loss/total"]
    # Steps 1 and 2: sampled before and after an update; each sync probed and decided "loaded".
    assert max(found["mismatch/abs_diff_max"]) < 1e-4, found["mismatch/abs_diff_max"]
    assert max(found["sync/probe_max_abs_diff"]) < 1e-4 and not any(found["sync/probe_undecided"])
    assert found["sync/megabytes"] == [pytest.approx(MODEL_MB, abs=0.01)] * 2
    assert f"weight sync: the weights ({MODEL_MB:.2f} MB)" in console
    shown = [line for line in console.splitlines() if any(noise in line for noise in NOISE)]
    assert not shown, "\n".join(shown)


@pytest.mark.vllm
def test_a_resumed_gemma_run_makes_the_same_second_step_and_weights(vllm_run, reward_file, tmp_path):
    assert_resume_remakes_step_two(
        vllm_run[0], tmp_path / "resumed", lambda folder: train(folder, reward_file, "rollout.backend=vllm")
    )


@pytest.mark.vllm
def test_the_saved_gemma_loads_in_transformers_and_eval_scores_it_as_the_runs_last_evaluation(vllm_run, tmp_path):
    out, _ = vllm_run
    last_accuracy = run_metrics(out)["eval/accuracy"][-1]
    done = run_cli(
        *("eval", "--config", str(RECIPE), "--model", str(out / "model"), "--backend", "vllm"),
        *("--set", "data.eval_limit=16", "--output-dir", str(tmp_path / "eval")),
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = re.search(r"held-out accuracy (\S+)", done.stdout)
    # Printed to 3 decimals (1/16 is 0.062): the same count of 16 right.
    assert said and round(float(said.group(1)) * 16) == round(last_accuracy * 16), done.stdout
    # A plain transformers folder: no GGUF, no quantization config, the tied head one tensor, the
    # tokenizer that adds <bos>.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((out / "model" / "config.json").read_text())
    assert config["tie_word_embeddings"] and "quantization_config" not in config
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert AutoTokenizer.from_pretrained(out / "model")("Hi")["input_ids"][0] == 2


def test_lora_on_gemma_sends_only_the_adapter_to_an_engine_that_samples_the_learners_policy(hf_lora_run):
    out, _ = hf_lora_run
    found = run_metrics(out)
    # r=8 on q, k, v and o of 18 layers (q: 640 -> 4 x 256, k and v: 640 -> 256, o: 1024 -> 640):
    # 18 x 8 x ((640 + 1024) x 2 + (640 + 256) x 2) = 737,280 float32 parameters, 2.95 MB a sync.
    assert found["sync/megabytes"] == [pytest.approx(2.94912, abs=1e-4)] * 2, found["sync/megabytes"]
    assert max(found["mismatch/abs_diff_max"]) < 1e-4, found["mismatch/abs_diff_max"]
    assert all(abs(v) > 0 for v in found["loss/total"])


@pytest.mark.vllm
def test_past_the_sliding_window_the_vllm_engine_scores_gemma_as_the_learner_does():
    """700 tokens: Gemma's sliding-window layers see the last 512 of them, its full layers all. vLLM's
    prompt log-probs (the probe's path) equal the learner's function within 1e-4 at every position,
    and past token 512 they differ from what a model without the window computes, so the window was
    in force on both sides."""
    import torch

    from grpo_ray.actors.vllm_engine import VllmEngine
    from grpo_ray.models.gemma3 import few_shot_prompt
    from grpo_ray.models.loading import load_causal_lm, load_tokenizer, resolve_model_path, sequence_logprobs

    if not HAS_VLLM:
        pytest.skip("vllm is not installed")
    path, tokenizer = resolve_model_path("gemma3-270m"), load_tokenizer("gemma3-270m")
    text = "\n\n".join(few_shot_prompt(a, b) + f" {a + b}" for a in range(10, 60) for b in (3, 7))
    ids = np.array([tokenizer(text)["input_ids"][:700]])
    mask = np.ones_like(ids)
    engine = VllmEngine(path, tokenizer, max_model_len=1024, cpu_kv_cache_gb=0.5)
    try:
        served = engine.score(ids, mask, temperature=1.0)
    finally:
        engine.shutdown()
    with torch.no_grad():
        learned, unwindowed = (
            # The second with a window past the row: every layer sees every token.
            sequence_logprobs(
                load_causal_lm(path, config_overrides=overrides), torch.from_numpy(ids), torch.from_numpy(mask)
            )[0].numpy()
            for overrides in (None, {"sliding_window": 4096})
        )
    assert np.abs(served - learned)[0, 1:].max() < 1e-4
    assert np.abs(unwindowed - learned)[0, :512].max() < 1e-4 < np.abs(unwindowed - learned)[0, 512:].max()
