"""The memory plan of `grpo-ray validate`: the usual arithmetic, worked by hand for Qwen2.5-3B.

Qwen2.5-3B: hidden 2048, 36 layers, MLP 11008, 16 heads of 128, 2 KV heads (k/v width 256),
vocabulary 151936, tied embeddings, bias on q/k/v. Per layer:
    q 2048 x 2048 + 2048 = 4,196,352     k, v 2048 x 256 + 256 = 524,544 each
    o 2048 x 2048 = 4,194,304            MLP 3 x 2048 x 11008 = 67,633,152    norms 2 x 2048
    = 77,076,992; x 36 = 2,774,771,712
embeddings 151936 x 2048 = 311,164,928, final norm 2048: P = 3,085,938,688 (the published 3.09 B).
"""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from grpo_ray.cli import main
from grpo_ray.config import load_config
from grpo_ray.config.architectures import ARCHITECTURES, Architecture, find_architecture
from grpo_ray.config.memory import GIB, learner_memory, memory_plan
from grpo_ray.models.tiny import ensure_tiny_artifacts

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
P3B = 3_085_938_688


def qwen(name: str) -> Architecture:
    return Architecture.from_config(ARCHITECTURES[name])


def test_parameter_counts_match_the_published_sizes():
    assert qwen("qwen2.5-3b").parameters == P3B
    # 1.5B: 28 x 46,797,824 + 151936 x 1536 + 1536 = 1,543,714,304 (published 1.54 B).
    assert qwen("qwen2.5-1.5b").parameters == 1_543_714_304
    # 7B, untied: 28 x 233,057,792 + 2 x 152064 x 3584 + 3584 = 7,615,616,512 (published 7.62 B).
    assert qwen("qwen2.5-7b").parameters == 7_615_616_512


def test_full_fine_tune_in_bf16_is_16_bytes_per_parameter():
    # Weights 2 + gradients 2 + Adam (fp32 master 4 + m 4 + v 4) 12 = 16 B/param.
    memory = learner_memory(P3B, "bfloat16", ranks=1, zero_stage=0)
    assert (memory.weights, memory.gradients, memory.optimizer, memory.lora) == (2 * P3B, 2 * P3B, 12 * P3B, 0)
    assert memory.total == 16 * P3B == 49_375_019_008  # 45.98 GiB


def test_zero_sharding_and_offload():
    # ZeRO-2 over 2 ranks: weights whole, gradients and optimizer halved: 2 + 1 + 6 = 9 B/param.
    assert learner_memory(P3B, "bfloat16", ranks=2, zero_stage=2).total == 9 * P3B
    # ZeRO-3 shards the weights too: 1 + 1 + 6 = 8 B/param.
    assert learner_memory(P3B, "bfloat16", ranks=2, zero_stage=3).total == 8 * P3B
    # ZeRO-1 shards only the optimizer: 2 + 2 + 6 = 10.
    assert learner_memory(P3B, "bfloat16", ranks=2, zero_stage=1).total == 10 * P3B
    # Offloaded optimizer state leaves the GPU: 2 + 2.
    assert learner_memory(P3B, "bfloat16", ranks=1, zero_stage=2, offload_optimizer=True).total == 4 * P3B
    # float32 weights are their own master copy: 4 + 4 + 8 = 16.
    assert learner_memory(P3B, "float32", ranks=1, zero_stage=0).total == 16 * P3B


def test_lora_r32_on_the_attention_projections():
    # Per layer r x (in + out): q 32 x 4096, k 32 x 2304, v 32 x 2304, o 32 x 4096 = 409,600; x 36.
    lora = qwen("qwen2.5-3b").lora_parameters(32, ("q_proj", "k_proj", "v_proj", "o_proj"))
    assert lora == 14_745_600
    memory = learner_memory(P3B, "bfloat16", ranks=1, zero_stage=0, lora_parameters=lora)
    # Frozen base 2 B/param, no gradients or optimizer for it; the adapter 2 + 2 + 12 = 16 B/param.
    assert (memory.weights, memory.gradients, memory.optimizer) == (2 * P3B, 0, 0)
    assert memory.lora == 16 * lora == 235_929_600
    # QLoRA: the base at 0.5 B/param (4bit), 1 (8bit).
    assert learner_memory(P3B, "bfloat16", 1, 0, lora, quantization="4bit").weights == P3B / 2
    assert learner_memory(P3B, "bfloat16", 1, 0, lora, quantization="8bit").weights == P3B


def test_kv_cache_bytes_per_token():
    # 2 (k and v) x 36 layers x 2 KV heads x 128 x 2 bytes = 36,864 B.
    assert qwen("qwen2.5-3b").kv_bytes_per_token(2) == 36_864


def test_the_tiny_table_entry_is_the_built_tiny_model():
    config = json.loads((ensure_tiny_artifacts().model_dir / "config.json").read_text())
    assert Architecture.from_config(config) == find_architecture("tiny")


def test_hub_ids_resolve_through_the_table_and_unknown_ones_say_so():
    assert find_architecture("Qwen/Qwen2.5-3B-Instruct") == qwen("qwen2.5-3b")
    assert find_architecture("someone/unknown-9b") is None
    lines, warnings = memory_plan(load_config(CONFIGS / "tiny.yaml", ["model.path=someone/unknown-9b"]), 80)
    assert "policy someone/unknown-9b: its size is not known here" in lines[0] and warnings == []


def test_validate_warns_when_a_role_exceeds_the_gpu():
    # gsm8k-ref7b: the 3B full fine-tune needs 45.98 GiB on its one GPU.
    runner = CliRunner()
    roomy = runner.invoke(main, ["validate", str(CONFIGS / "gsm8k-ref7b.yaml"), "--plan-only"])
    assert roomy.exit_code == 0 and "warning" not in roomy.output
    assert re.search(
        r"learner +weights 5\.75 GiB +gradients 5\.75 GiB +optimizer 34\.49 GiB .*total 45\.98 GiB", roomy.output
    )
    # The 7B reference in bf16: 2 x 7,615,616,512 B = 14.19 GiB.
    assert re.search(r"reference +weights 14\.19 GiB", roomy.output)
    small = runner.invoke(main, ["validate", str(CONFIGS / "gsm8k-ref7b.yaml"), "--gpu-memory-gb", "40", "--plan-only"])
    assert small.exit_code == 0
    # It needs its state and its log-prob chunks: 3 x [512, 151936] float32 = 933,494,784 B, so
    # (49,375,019,008 + 933,494,784) / 2^30 = 46.85 GiB.
    assert "warning: learner needs 46.85 GiB per GPU, more than --gpu-memory-gb 40" in small.output


def test_colocated_roles_are_added_up():
    # gsm8k-lora-zero2: learner 2.89 GiB (the adapter's Adam state offloaded) + hf rollout 2.89 GiB on
    # each 8 GB GPU, and the larger of their passes: the learner's log-prob chunks, 3 x [512, 151936]
    # float32 = 933,494,784 B (0.87 GiB; the rollout's decoding step is 4 x [32, 151936] x 4 B = 0.07
    # GiB): 6.64 GiB (5.78 before rounding each to 2.89) fits 8; on 4 it does not.
    cfg = load_config(CONFIGS / "gsm8k-lora-zero2.yaml")
    assert memory_plan(cfg, 8)[1] == []
    [warning] = memory_plan(cfg, 4)[1]
    assert warning.startswith("learner + rollout share a GPU and need 6.64 GiB") and "--gpu-memory-gb 4" in warning


@pytest.mark.parametrize("gb", ["0", "-1"])
def test_gpu_memory_must_be_positive(gb):
    result = CliRunner().invoke(main, ["validate", str(CONFIGS / "tiny.yaml"), "--gpu-memory-gb", gb])
    assert result.exit_code == 2


def test_gib_is_two_to_the_thirty():
    assert GIB == 1 << 30


@pytest.mark.parametrize("level", [0, 1])
def test_a_shared_gpu_shows_both_phases_and_what_sleeping_frees(level):
    # gsm8k-lora-zero2's learner holds 2.89 GiB per rank (above); a vLLM engine beside it at 0.4 of 80 GiB holds 32.
    cfg = load_config(
        CONFIGS / "gsm8k-lora-zero2.yaml",
        ["rollout.backend=vllm", "rollout.vllm.gpu_memory_utilization=0.4", f"rollout.vllm.sleep_level={level}"],
    )
    lines, warnings = memory_plan(cfg, 80)
    assert warnings == []
    [phases] = [line for line in lines if line.startswith("one GPU in two phases")]
    assert f"(rollout.vllm.sleep_level {level}): rollout: learner 2.89 GiB + vLLM 32.00 GiB = 34.89 GiB" in phases
    if level:
        # Asleep, the engine gives the update all 32 GiB; vLLM may take (80 - 2.89 - 2) / 80 of the GPU.
        assert "update: learner 2.89 GiB + vLLM 0.00 GiB (asleep: weights in host memory), 77.11 GiB left" in phases
        assert "vLLM may take up to gpu_memory_utilization 0.94" in "\n".join(lines)
    else:
        assert "update: learner 2.89 GiB + vLLM 32.00 GiB (awake), 45.11 GiB left for activations" in phases
        assert "with rollout.vllm.sleep_level 1 the update would have 77.11 GiB" in "\n".join(lines)


def test_fractions_of_one_gpu_share_it_with_the_reference_beside_the_learner():
    # configs/gsm8k.yaml: learner 0.4, rollout 0.4, reference 0.2 of one GPU. Learner 7.36 GiB and the
    # reference's 0.92 stay through both phases; vLLM holds 0.3 x 80 = 24 GiB awake.
    lines, _ = memory_plan(load_config(CONFIGS / "gsm8k.yaml"), 80)
    [phases, advice] = [
        line for line in lines if line.startswith(("one GPU in two phases", "with rollout.vllm.sleep_level"))
    ]
    assert "rollout: learner and reference 8.28 GiB + vLLM 24.00 GiB = 32.28 GiB" in phases
    assert phases.endswith("(awake), 47.72 GiB left for activations")
    # Asleep the update would have 80 - 8.28; vLLM could take (80 - 8.28 - 2) / 80 = 0.87.
    assert advice == (
        "with rollout.vllm.sleep_level 1 the update would have 71.72 GiB for activations, "
        "or vLLM up to gpu_memory_utilization 0.87"
    )


def test_moments_and_gradients_are_what_the_offload_between_updates_moves():
    # bf16 full fine-tune on one rank: gradients 2 B/param, Adam's m and v 8 (the 4 B master copy stays).
    assert learner_memory(P3B, "bfloat16", ranks=1, zero_stage=2).moments_and_gradients == 10 * P3B
    # Two ZeRO-2 ranks: each holds half of both.
    assert learner_memory(P3B, "bfloat16", ranks=2, zero_stage=2).moments_and_gradients == 5 * P3B
    # ZeRO-1 shards the optimizer only: 2 + 8 / 2.
    assert learner_memory(P3B, "bfloat16", ranks=2, zero_stage=1).moments_and_gradients == 6 * P3B
    # LoRA: the adapter's gradients and moments, 2 + 8 B per adapter parameter; the base has neither.
    assert learner_memory(P3B, "bfloat16", 1, 2, lora_parameters=1000).moments_and_gradients == 10 * 1000


def test_the_offload_between_updates_lets_vllm_take_the_moments_and_gradients_room():
    # configs/gsm8k.yaml on one 80 GiB GPU, full fine-tune: the learner's 16 B/param (7.36 GiB) less
    # 10 B/param (4.60 GiB) while the engine is awake; the reference's 0.92 GiB stays.
    overrides = ["rollout.vllm.sleep_level=1", "learner.zero_stage=2", "learner.offload_states_between_updates=true"]
    lines, _ = memory_plan(load_config(CONFIGS / "gsm8k.yaml", overrides), 80)
    [phases, advice] = [line for line in lines if line.startswith(("one GPU in two phases", "vLLM may take"))]
    assert (
        "rollout: learner and reference 3.68 GiB (4.60 GiB of moments and gradients in host memory) + vLLM 24.00 GiB"
        in phases
    )
    assert "update: learner and reference 8.28 GiB + vLLM 0.00 GiB (asleep" in phases
    # (80 - 3.68 - 2) / 80 = 0.93, where it stays 0.87 without the offload.
    assert advice.startswith(
        "vLLM may take up to gpu_memory_utilization 0.93 (the GPU less the learner and reference's 3.68 GiB"
    )
    without, _ = memory_plan(load_config(CONFIGS / "gsm8k.yaml", overrides[:2]), 80)
    assert any(line.startswith("vLLM may take up to gpu_memory_utilization 0.87") for line in without)


def test_a_teacher_is_a_row_of_its_weights_and_counts_on_the_learners_gpu_when_it_shares_it():
    # configs/gsm8k.yaml (learner 0.4, rollout 0.4, reference 0.2 of one GPU) with a Qwen2.5-1.5B teacher on
    # 0.2 of it: 1,543,714,304 x 2 B = 2.88 GiB in bf16, beside the learner's 7.36 and the reference's 0.92
    # (494,032,768 parameters at 16 + 2 B) through both phases: 8.28 + 2.88 = 11.16 GiB.
    teacher = "distillation.teachers=[{name: big, model_path: Qwen/Qwen2.5-1.5B-Instruct, num_gpus: 0.2}]"
    cfg = load_config(CONFIGS / "gsm8k.yaml", [teacher])
    lines, warnings = memory_plan(cfg, 80)
    # Its log-prob pass over a micro-batch of 16 x 512 completion tokens, a chunk at a time: 3 x
    # [512, 151936] float32 = 0.87 GiB, counted while it runs (the phases count what is held).
    assert (
        "teacher-big  weights 2.88 GiB (Qwen/Qwen2.5-1.5B-Instruct, on the learner's GPU); "
        "logits 0.87 GiB (3 x [512, 151936] float32, chunks of 512)"
    ) in lines
    [phases] = [line for line in lines if line.startswith("one GPU in two phases")]
    assert "rollout: learner, reference and teacher-big 11.16 GiB + vLLM 24.00 GiB = 35.16 GiB" in phases
    assert warnings == []
    # On a 10 GiB GPU the three do not fit together, though each alone would: 11.16 + one pass's 0.87.
    assert memory_plan(cfg, 10)[1] == [
        "learner + reference + teacher-big share a GPU and need 12.03 GiB, more than --gpu-memory-gb 10"
    ]


def test_a_teacher_on_a_gpu_of_its_own_is_warned_about_when_it_does_not_fit_and_an_unknown_one_says_so():
    # Qwen2.5-7B in bf16: 2 x 7,615,616,512 B = 14.19 GiB on its own GPU: it fits 16 GiB, not 12.
    teachers = (
        "distillation.teachers=[{name: big, model_path: Qwen/Qwen2.5-7B-Instruct, num_gpus: 1}, "
        "{name: other, model_path: someone/unknown-9b, sources: [math]}]"
    )
    cfg = load_config(CONFIGS / "gsm8k.yaml", [teachers])
    lines, warnings = memory_plan(cfg, 16)
    teacher = "teacher-big  weights 14.19 GiB (Qwen/Qwen2.5-7B-Instruct); logits 0.87 GiB (3 x [512, 152064] float32"
    assert any(line.startswith(teacher) for line in lines) and warnings == []
    assert any(line.startswith("teacher-other someone/unknown-9b: its size is not known here") for line in lines)
    # 14.19 GiB + its chunks 3 x [512, 152064] x 4 B = 934,281,216 B: 15,231,233,024 + 934,281,216 B = 15.06 GiB.
    assert memory_plan(cfg, 12)[1] == ["teacher-big needs 15.06 GiB per GPU, more than --gpu-memory-gb 12"]
