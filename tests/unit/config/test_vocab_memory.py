"""What grows with the vocabulary (config/vocab_memory.py) and the shapes behind it
(config/architectures.py): Gemma 3 270M's explicit head_dim and 262,144-token vocabulary, Qwen3-4B,
and a plan for every shipped recipe."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from grpo_ray.cli import main
from grpo_ray.config import load_config
from grpo_ray.config.architectures import ARCHITECTURES, Architecture, find_architecture
from grpo_ray.config.memory import GIB, memory_plan
from grpo_ray.config.vocab_memory import (
    CHUNKABLE_TYPES,
    head_is_chunkable,
    micro_batch_positions,
    sampling_term,
    scoring_term,
    scoring_vocab,
)
from grpo_ray.models.lm_head import PLAIN_HEAD_TYPES

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
GEMMA = Architecture.from_config(ARCHITECTURES["gemma3-270m"])


def test_gemma3_270m_parameters_by_hand():
    # head_dim 256 (not 640 / 4 = 160): q 640 x 1024 = 655,360, k and v 640 x 256 = 163,840 each,
    # o 1024 x 640 = 655,360; MLP 3 x 640 x 2048 = 3,932,160; four norms of 640 and q/k norms of 256:
    # 3,072. Per layer 5,573,632; x 18 = 100,325,376. Tied embedding 262144 x 640 = 167,772,160,
    # final norm 640: 268,098,176 (transformers' count of the real model: 268.1 M).
    assert GEMMA.head_dim == 256 and GEMMA.matrix_shapes()["o_proj"] == (1024, 640)
    assert GEMMA.embedding_parameters == 167_772_160
    assert GEMMA.parameters == 268_098_176
    assert find_architecture("google/gemma-3-270m") == GEMMA == find_architecture("gemma3-270m")


def test_qwen3_4b_and_the_r1_distill_by_hand():
    # Qwen3-4B: q 2560 x 4096 and o 4096 x 2560 = 10,485,760 each, k and v 2560 x 1024 = 2,621,440
    # each, MLP 3 x 2560 x 9728 = 74,711,040, norms 2 x 2560 + q/k 2 x 128 = 5,376, no bias:
    # 100,930,816 per layer; x 36 = 3,633,509,376; + 151936 x 2560 (tied) + 2560 = 4,022,468,096.
    assert find_architecture("Qwen/Qwen3-4B").parameters == 4_022_468_096
    # DeepSeek-R1-Distill-Qwen-7B has Qwen2.5-7B's shape: 7,615,616,512 (published 7.62 B).
    assert find_architecture("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B").parameters == 7_615_616_512


@pytest.mark.parametrize("name", ["gemma3-270m", "qwen3-4b"])
def test_the_counts_are_transformers_own(name):
    # The model transformers builds from the same config.json fields, on the meta device (no memory).
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(ARCHITECTURES[name])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == find_architecture(name).parameters


def test_sliding_window_layers_keep_their_window_of_kv():
    # 3 full layers keep 2,000 tokens, 15 sliding ones 512: 2 x (3 x 2000 + 15 x 512) x 1 head x 256
    # x 4 B = 2 x 13,680 x 1,024 = 28,016,640 B.
    assert GEMMA.kv_bytes(2000, 4) == 28_016_640
    # Within the window every layer keeps every token: 2 x 18 x 100 x 256 x 4.
    assert GEMMA.kv_bytes(100, 4) == 2 * 18 * 100 * 256 * 4


def test_gemma_full_logits_dominate_its_micro_batch_and_its_head_is_chunked():
    # Without chunks (learner.logprob_chunk_tokens 0), a micro-batch of 64 completions of 16 tokens
    # is 1,024 positions of 262,144 float32 logits = 1 GiB a copy; the learner holds 4 (logits, exp
    # temporary, entropy's probabilities, gradient): 4 GiB, against 268,098,176 x 4 B = 1.0 GiB of
    # float32 weights.
    positions = micro_batch_positions(64, 16)
    learner = scoring_term(GEMMA.vocab, positions, chunk_tokens=0, chunkable=True, with_grad=True)
    assert (learner.positions, learner.copies, learner.bytes) == (1024, 4, 4 * GIB)
    # The reference: no gradient, 3 copies; a temperature other than 1 divides into one more.
    assert scoring_term(GEMMA.vocab, positions, chunk_tokens=0, chunkable=True, with_grad=False).bytes == 3 * GIB
    hot = scoring_term(GEMMA.vocab, positions, chunk_tokens=0, chunkable=True, with_grad=True, temperature=0.7)
    assert hot.bytes == 5 * GIB
    # Gemma 3's head is lm_head(hidden) alone (no soft-cap): chunks of 512 hold 3 x 512 x 262,144 x 4 B.
    assert head_is_chunkable(GEMMA.model_type)
    chunked = scoring_term(GEMMA.vocab, positions, chunk_tokens=512, chunkable=True, with_grad=True)
    assert chunked.bytes == 1_610_612_736 and chunked.path == "chunks of 512"


def test_a_chunked_head_holds_a_chunk_whatever_the_batch():
    # SmolLM2 (llama) with logprob_chunk_tokens 512: 3 x 512 x 49152 x 4 B = 301,989,888 B.
    term = scoring_term(49152, 1024, chunk_tokens=512, chunkable=True, with_grad=True)
    assert term.bytes == 301_989_888 and term.path == "chunks of 512"
    # Fewer positions than a chunk: the chunk is the micro-batch.
    assert scoring_term(49152, 100, chunk_tokens=512, chunkable=True, with_grad=True).positions == 100
    # logprob_chunk_tokens 0 takes the full logits: 4 x 1024 x 49152 x 4.
    assert scoring_term(49152, 1024, chunk_tokens=0, chunkable=True, with_grad=True).bytes == 805_306_368
    # A LoRA-wrapped head or ZeRO-3's partitioned one are refused by plain_lm_head.
    assert not head_is_chunkable("llama", lora_on_head=True) and not head_is_chunkable("qwen2", zero3=True)


def test_the_chunkable_families_are_models_lm_heads():
    assert CHUNKABLE_TYPES == PLAIN_HEAD_TYPES


def test_a_token_budget_caps_the_micro_batch_positions():
    # 64 rows x 16 = 1,024, a budget of 256 caps it; a row longer than the budget goes alone.
    assert micro_batch_positions(64, 16, 0) == 1024
    assert micro_batch_positions(64, 16, 256) == 256
    assert micro_batch_positions(64, 600, 256) == 600


def test_sampling_a_decoding_step():
    # hf: the worker's 64 rows, 4 copies of [64, 262144] float32 = 268,435,456 B (0.25 GiB).
    assert sampling_term(262144, 64, "hf").bytes == 268_435_456
    # vLLM: its sampler's 3 copies of at most max_num_seqs rows: 3 x 32 x 262144 x 4 = 100,663,296.
    assert sampling_term(262144, 64, "vllm", max_num_seqs=32).bytes == 100_663_296


def test_the_recipe_path_for_gemma_on_smollm2s_recipe():
    # configs/smollm2-arithmetic.yaml's batch (micro_batch_size 64, max_new_tokens 16, temperature 1)
    # with the gemma model: the chunked term of test_gemma_full_logits_dominate..., 1.5 GiB.
    cfg = load_config(CONFIGS / "smollm2-arithmetic.yaml")
    assert scoring_vocab(cfg, GEMMA, with_grad=True).bytes == 1_610_612_736
    assert scoring_vocab(cfg, find_architecture("smollm2-135m"), with_grad=True).bytes == 301_989_888


def test_vllm_on_a_gpu_takes_its_sampler_from_the_kv_cache():
    # gsm8k: one vLLM engine at 0.3 of 80 GiB; the 0.5B model in bf16 is 988,065,536 B; 64 prompts x 8
    # = 512 rows sampled at once, 3 x 512 x 151936 x 4 B = 933,494,784 B for the sampler:
    # 0.3 x 80 GiB - 988,065,536 - 933,494,784 = 23.98 GiB - 1.79 GiB = 22.21 GiB of KV cache.
    lines, _ = memory_plan(load_config(CONFIGS / "gsm8k.yaml"), 80)
    [rollout] = [line for line in lines if line.startswith("rollout ")]
    assert "logits 0.87 GiB (3 x [512, 151936] float32, vLLM's sampler)  KV cache 22.21 GiB" in rollout


@pytest.mark.parametrize("recipe", sorted(path.name for path in CONFIGS.glob("*.yaml")))
def test_every_shipped_recipe_gets_a_memory_plan(recipe):
    result = CliRunner().invoke(main, ["validate", str(CONFIGS / recipe), "--plan-only"])
    assert result.exit_code == 0, result.output
    plan = result.output.split("# batch per step", 1)[1]
    assert "# memory per GPU" in plan or "# host memory" in plan
    # The policy's size is known (a teacher a recipe builds first may not be, said on its row).
    assert "policy " not in plan or "its size is not known" not in plan.split("policy ", 1)[1].splitlines()[0]
    assert "learner " in plan
