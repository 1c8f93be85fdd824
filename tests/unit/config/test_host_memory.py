"""The host memory plan of a recipe whose roles run on the CPU (config/host_memory.py), worked by hand
for configs/smollm2-arithmetic.yaml, and validate's warning near Ray's memory monitor.

SmolLM2-135M in float32, 134,515,008 parameters, one learner, one hf rollout worker, one reward worker:
    driver 0.61 GiB + Ray 0.38 GiB (the measured processes, host_memory.PROCESS_GIB)
    learner  0.50 + 16 B/param x 134,515,008 = 2,152,240,128 B (2.00 GiB) + its log-prob chunks
             3 x [512, 49152] x 4 B = 301,989,888 B (0.28 GiB) + a 64-row micro-batch's activations
             3,083,809,920 B (2.87 GiB, worked in test_activation_memory.py)        = 5.66 GiB
    rollout  0.48 + weights 538,060,032 B (0.50 GiB) + a decoding step 4 x [64, 49152] x 4 B =
             50,331,648 B (0.05) + transformers' cache of 64 rows x 80 tokens x 2 x 30 layers x 3
             heads x 64 x 4 B = 235,929,600 B (0.22)                                 = 1.25 GiB
    reward   0.21 GiB
    sum      8.11 GiB
Measured (2026-11-28, this 2-core 23 GiB machine, `grpo-ray train configs/smollm2-arithmetic.yaml
--set train.steps=2`, every process of the run sampled once a second): the processes' PSS peaked at
7.72 GiB together (RSS 9.35 GiB, shared libraries counted in every process), 5% under the plan. The
learner reached 5.48 GiB against its planned 5.66 (the plan takes every prompt at max_prompt_tokens
64; they are ~46); before its activations were counted the plan said 2.79 for it and 5.23 in all. The
rollout worker reached 1.75 against 1.25 (evaluation samples 200 prompts at once, training 64 rows).
"""

from pathlib import Path

from grpo_ray.commands.validate import plan_report
from grpo_ray.config import load_config
from grpo_ray.config.host_memory import MachineMemory, host_memory_warning, host_plan_lines, host_roles, on_the_cpu
from grpo_ray.config.memory import GIB

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
SMOLLM2 = load_config(CONFIGS / "smollm2-arithmetic.yaml")


def by_role():
    return {role.role: role for role in host_roles(SMOLLM2)}


def test_smollm2_host_plan_by_hand():
    roles = by_role()
    learner, rollout = roles["learner"], roles["rollout"]
    assert learner.model == 2_152_240_128 and learner.vocab.bytes == 301_989_888
    assert learner.activations.bytes == 3_083_809_920
    assert learner.each == 0.50 * GIB + 2_152_240_128 + 301_989_888 + 3_083_809_920
    assert (rollout.model, rollout.vocab.bytes, rollout.cache) == (538_060_032, 50_331_648, 235_929_600)
    total = sum(role.total for role in roles.values())
    assert round(total / GIB, 2) == 8.11
    # Within 10% of the 7.72 GiB the run held (the module docstring).
    assert abs(total / GIB - 7.72) / 7.72 < 0.10


def test_the_plan_is_printed_as_host_memory_not_per_gpu():
    lines, warnings = plan_report(SMOLLM2, 80, machine=MachineMemory(23.5 * GIB, 18 * GIB))
    text = "\n".join(lines)
    assert "# memory per GPU" not in text and warnings == []
    assert (
        "# host memory of the roles on the CPU (estimate; this machine 23.5 GiB, 18.0 available now; "
        "Ray kills workers above 0.95 of it)" in text
    )
    assert (
        "learner      x1  process 0.50 GiB  model 2.00 GiB  logits 0.28 GiB (3 x [512, 49152] float32, chunks of "
        "512)  activations 2.87 GiB (micro-batch 64 x 80 tokens, 8 prompts once)  = 5.66 GiB each" in lines
    )
    assert "sum              8.11 GiB" in lines


def test_a_gpu_recipe_has_no_host_plan():
    # gsm8k-lora-zero2: learners and rollout workers on halves of GPUs, no reference.
    cfg = load_config(CONFIGS / "gsm8k-lora-zero2.yaml")
    assert not on_the_cpu(cfg)
    lines, _ = plan_report(cfg, 80, machine=MachineMemory(8 * GIB, 8 * GIB))
    assert not any(line.startswith("# host memory") for line in lines)


def test_the_warning_comes_when_the_sum_passes_rays_threshold():
    roles = host_roles(SMOLLM2)
    # 9 GiB free: 8.11 GiB stays under 0.95 x 9 = 8.55 GiB.
    assert host_memory_warning(roles, MachineMemory(9 * GIB, 9 * GIB)) is None
    # 8 GiB: 0.95 x 8 = 7.60 GiB < 8.11.
    assert host_memory_warning(roles, MachineMemory(8 * GIB, 8 * GIB)) == (
        "the roles on the CPU need 8.11 GiB; with 0.00 GiB in use now of this machine's 8.00 GiB that passes "
        "Ray's memory monitor threshold 0.95 (7.60 GiB, RAY_memory_usage_threshold), where it kills workers: "
        "learner holds the most (5.66 GiB); lower learner.micro_batch_size (activations, logits), "
        "learner.gradient_checkpointing (activations) or learner.num_workers, or train with model.lora"
    )
    # What is in use now counts: of 12 GiB (11.40 under the threshold), 3 GiB in use leaves 8.40, 4 GiB 7.40.
    assert host_memory_warning(roles, MachineMemory(12 * GIB, 9 * GIB)) is None
    assert "with 4.00 GiB in use now" in host_memory_warning(roles, MachineMemory(12 * GIB, 8 * GIB))
    # A lower threshold (RAY_memory_usage_threshold 0.6: 5.40 GiB) warns on an idle 9 GiB machine.
    assert host_memory_warning(roles, MachineMemory(9 * GIB, 9 * GIB, 0.6)) is not None


def test_vllm_cpu_counts_its_engine_process_and_kv_cache():
    # rollout.backend vllm: the engine process holds the weights, the sampler's 3 x [64, 49152] x 4 B
    # = 37,748,736 B and rollout.vllm.cpu_kv_cache_gb 2 GiB, as vllm_cpu.py gives vLLM.
    cfg = load_config(CONFIGS / "smollm2-arithmetic.yaml", ["rollout.backend=vllm", "rollout.vllm.cpu_kv_cache_gb=2"])
    engine = {role.role: role for role in host_roles(cfg)}["rollout-vllm"]
    assert (engine.model, engine.vocab.bytes, engine.cache) == (538_060_032, 37_748_736, 2 * GIB)


def test_a_teacher_whose_size_is_not_known_is_its_process_alone():
    # configs/smollm2-distill.yaml's teacher is a folder another run writes: not there, no size.
    roles = {role.role: role for role in host_roles(load_config(CONFIGS / "smollm2-distill.yaml"))}
    [teacher] = [role for name, role in roles.items() if name.startswith("teacher-")]
    assert teacher.model == 0 and "its size is not known here" in teacher.note


def test_the_learner_row_names_its_forward():
    # Packed and checkpointed: one row of 64 x 80 = 5,120 positions; checkpointing off the shared pass.
    sets = ["learner.packing=true", "learner.gradient_checkpointing=true"]
    lines = host_plan_lines(host_roles(load_config(CONFIGS / "smollm2-arithmetic.yaml", sets)))
    [row] = [line for line in lines if line.startswith("learner")]
    assert "(5120 tokens packed, checkpointed)" in row
