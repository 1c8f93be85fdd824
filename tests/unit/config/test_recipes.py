"""The shipped recipes (configs/*.yaml): each loads; the POLARIS recipes carry POLARIS's published
numbers; `grpo-ray validate` prints polaris.yaml's three stages; every field has its own comment."""

import math
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from grpo_ray.cli import main
from grpo_ray.config import load_config, plan_batches, plan_resources, plan_stages, total_steps
from grpo_ray.data.formats import POLARIS_INSTRUCTION
from grpo_ray.rewards import load_reward_function

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "configs"
RECIPES = sorted(CONFIGS.glob("*.yaml"))
POLARIS_RECIPES = [CONFIGS / "polaris.yaml", CONFIGS / "polaris-7b.yaml"]

# Recipes written before the comment rule, owned elsewhere: tracked here so the test turns red
# (strict xfail) the day they are fixed, and the mark can go.
COMMENT_RULE_PENDING: dict[str, str] = {}


def recipe_id(path: Path) -> str:
    return path.name


def total_gpus(cfg) -> float:
    return math.fsum(role.count * role.num_gpus for role in plan_resources(cfg))


# ---- every recipe loads -----------------------------------------------------------------------


def test_the_expected_recipes_are_shipped():
    assert {
        "tiny.yaml",
        "polaris.yaml",
        "polaris-7b.yaml",
        "gsm8k.yaml",
        "gsm8k-lora-zero2.yaml",
        "gsm8k-ref7b.yaml",
        "tldr.yaml",
        "smollm2-arithmetic.yaml",
        "smollm2-tools.yaml",
        "tiny-distill.yaml",
        "smollm2-distill.yaml",
    } <= {p.name for p in RECIPES}


@pytest.mark.parametrize("path", RECIPES, ids=recipe_id)
def test_recipe_loads_and_its_batch_divides(path):
    cfg = load_config(path)
    plan = plan_batches(cfg)
    assert plan.completions_per_step == cfg.train.prompts_per_step * cfg.rollout.samples_per_prompt


# ---- POLARIS (Qwen3-4B): the numbers of POLARIS's scripts/train/qwen3-4b/stage{1,2,3}.sh -------


@pytest.mark.parametrize(
    "recipe, model, stages",
    [
        # The step split is ours.
        pytest.param(
            "polaris.yaml",
            "Qwen/Qwen3-4B",
            [(400, 39936, 1.4, 1.2), (200, 48128, 1.45, 1.4), (100, 52224, 1.5, 1.4)],
            id="polaris",
        ),
        # Stage 1 is the published 7B script (15360 tokens at 0.7, validated at 0.6); 1.0 / 1.1 are the
        # reported later temperatures; stages 2-3's lengths and eval temperatures are ours.
        pytest.param(
            "polaris-7b.yaml",
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
            [(400, 15360, 0.7, 0.6), (200, 20480, 1.0, 0.6), (100, 20480, 1.1, 0.6)],
            id="polaris-7b",
        ),
    ],
)
def test_polaris_stages_lengths_and_temperatures(recipe, model, stages):
    cfg = load_config(CONFIGS / recipe)
    # (steps, max_new_tokens, rollout temperature, eval temperature) of each stage.
    assert [(s.steps, s.max_new_tokens, s.temperature, s.eval_temperature) for s in plan_stages(cfg)] == stages
    assert total_steps(cfg) == 700
    assert cfg.model.path == model


def test_polaris_sequence_lengths():
    cfg = load_config(CONFIGS / "polaris.yaml")
    # Total sequence lengths 40K / 48K / 52K: the 1024 prompt tokens plus each stage's completion.
    assert cfg.data.max_prompt_tokens == 1024
    assert [cfg.data.max_prompt_tokens + s.max_new_tokens for s in plan_stages(cfg)] == [
        40 * 1024,
        48 * 1024,
        52 * 1024,
    ]


@pytest.mark.parametrize("path", POLARIS_RECIPES, ids=recipe_id)
def test_polaris_shared_settings(path):
    cfg = load_config(path)
    a, r = cfg.algorithm, cfg.rollout
    # Data: POLARIS-53K with POLARIS's instruction; AIME24 for validation.
    assert cfg.data.train_files == ("POLARIS-Project/Polaris-Dataset-53K",)
    assert cfg.data.instruction == POLARIS_INSTRUCTION
    assert cfg.data.eval_files == ("HuggingFaceH4/aime_2024",)  # a hub id: no path outside the repository
    # G = 8 samples of 128 prompts: 1024 completions per step.
    assert (r.samples_per_prompt, cfg.train.prompts_per_step) == (8, 128)
    assert plan_batches(cfg).completions_per_step == 1024
    # Sampling: vLLM, no nucleus or top-k cut in any stage; avg@8 evaluation.
    assert (r.backend, r.top_p, r.top_k) == ("vllm", 1.0, -1)
    assert all(stage.top_p == 1.0 for stage in plan_stages(cfg))
    assert cfg.train.eval_samples == 8
    # Loss: GRPO, clip 0.2 / 0.28, no KL (so no reference model), no entropy bonus, token-mean.
    assert (a.advantage, a.normalize_by_std) == ("grpo", True)
    assert (a.clip_low, a.clip_high) == (0.2, 0.28)
    assert (a.kl_coef, a.entropy_coef) == (0.0, 0.0)
    assert not cfg.use_reference
    assert a.loss_aggregation == "token-mean"
    assert a.overlong == "zero_reward"
    # Optimizer: constant lr 1e-6.
    assert cfg.learner.lr == 1e-6
    # POLARIS's batch techniques.
    p = cfg.polaris
    assert (p.substitution, p.rescue, p.drop_easy_threshold) == (True, True, 0.9)
    # One node of 8 GPUs, bf16, its own MLflow experiment.
    assert total_gpus(cfg) == 8
    assert cfg.model.dtype == "bfloat16"
    assert cfg.tracking.experiment == "polaris"


@pytest.mark.parametrize("path", POLARIS_RECIPES, ids=recipe_id)
def test_polaris_reward_needs_a_closed_think_block(path):
    # The POLARIS/DeepScaleR rule: the right boxed answer scores 0 unless </think> closed the reasoning.
    [spec] = load_config(path).reward.functions
    assert spec.name == "math" and spec.options["require_think_close"] is True
    fn = load_reward_function(spec.name, spec.options)
    assert fn(["so \\boxed{204}", "<think>5 h 24 min</think> \\boxed{204}"], ["", ""], ["204", "204"]) == [0.0, 1.0]


# ---- GSM8K --------------------------------------------------------------------------------------


def test_gsm8k_recipe():
    cfg = load_config(CONFIGS / "gsm8k.yaml")
    r, a = cfg.rollout, cfg.algorithm
    assert cfg.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (r.samples_per_prompt, cfg.train.prompts_per_step, r.max_new_tokens, r.temperature) == (8, 64, 512, 1.0)
    assert cfg.learner.lr == 1e-6
    # KL 0.001 with the k3 estimator as a term of the loss: a reference model runs.
    assert (a.kl_coef, a.kl_estimator, a.kl_placement) == (0.001, "k3", "loss")
    assert cfg.use_reference
    assert cfg.stages == () and len(plan_stages(cfg)) == 1
    assert total_gpus(cfg) == 1
    [spec] = cfg.reward.functions
    assert spec.name == "gsm8k"
    fn = load_reward_function(spec.name, spec.options)
    assert fn(["6 + 6 = 12\n#### 12", "#### 13"], ["", ""], ["12", "12"]) == [1.0, 0.0]


# ---- the founding setups ---------------------------------------------------------------------------


def test_gsm8k_lora_zero2_recipe():
    cfg = load_config(CONFIGS / "gsm8k-lora-zero2.yaml")
    lora, ln, plan = cfg.model.lora, cfg.learner, plan_batches(cfg)
    assert cfg.model.path == "Qwen/Qwen2.5-1.5B-Instruct" and cfg.model.dtype == "float16"
    assert (lora.enabled, lora.rank, lora.alpha, lora.dropout) == (True, 16, 32.0, 0.1)
    assert lora.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert (ln.lr, ln.grad_clip, ln.zero_stage) == (5e-5, 1.0, 2)
    # 4 completions per device x 8 accumulation x 2 GPUs.
    assert (plan.micro_batch_size, plan.grad_accum_steps, ln.num_workers) == (4, 8, 2)
    assert total_gpus(cfg) == 2 and cfg.weight_sync.lora_adapter_only
    # Reward 0.7 x think tags + 0.3 x unique characters; gsm8k at weight 0 is the accuracy.
    accuracy, reward = cfg.reward.functions
    assert (accuracy.name, accuracy.weight, reward.name, reward.weight) == ("gsm8k", 0.0, "think_tag_diversity", 1.0)
    fn = load_reward_function(reward.name, reward.options)
    # "<think>ab</think>": tags 0.7 + 0.3 x 10 distinct (< t h i n k > a b /) of 17 characters.
    assert fn(["<think>ab</think>"], [""], [""]) == [pytest.approx(0.7 + 0.3 * 10 / 17)]


def test_gsm8k_ref7b_recipe():
    cfg = load_config(CONFIGS / "gsm8k-ref7b.yaml")
    assert cfg.model.path == "Qwen/Qwen2.5-3B-Instruct"
    assert cfg.use_reference and cfg.reference.model_path == "Qwen/Qwen2.5-7B-Instruct"
    # Each role on a GPU of its own: learner, rollout, reference.
    gpus = {role.role: role.count * role.num_gpus for role in plan_resources(cfg)}
    assert (gpus["learner"], gpus["rollout"], gpus["reference"]) == (1, 1, 1) and cfg.placement.colocate == ()
    accuracy, reward = cfg.reward.functions
    assert (accuracy.name, accuracy.weight, reward.weight) == ("gsm8k", 0.0, 1.0)
    shown = CliRunner().invoke(main, ["validate", str(CONFIGS / "gsm8k-ref7b.yaml"), "--plan-only"]).output
    assert re.search(r"reference model +yes \(Qwen/Qwen2\.5-7B-Instruct\)", shown)
    fn = load_reward_function(reward.name, reward.options)
    # +1 / -1 for the answer, +1.25 / -1 for <think>...</think><answer>...</answer>.
    completions = ["<think>48+24</think><answer>72</answer>", "72", "<think>x</think><answer>71</answer>", "71"]
    assert fn(completions, [""] * 4, ["#### 72"] * 4) == [2.25, 0.0, 0.25, -2.0]


def test_tldr_recipe():
    cfg = load_config(CONFIGS / "tldr.yaml")
    assert cfg.rollout.samples_per_prompt == 8 and cfg.data.train_files == ("trl-lib/tldr",)
    [spec] = cfg.reward.functions
    fn = load_reward_function(spec.name, spec.options)
    # TRL's reward_len: -|20 - characters|.
    assert fn(["x" * 20, "x" * 25, ""], [""] * 3, [""] * 3) == [0.0, -5.0, -20.0]


def test_gsm8k_lora_zero2_warms_up_decays_and_offloads_the_optimizer():
    cfg = load_config(CONFIGS / "gsm8k-lora-zero2.yaml")
    ln = cfg.learner
    assert (ln.lr_schedule, ln.warmup_steps, ln.offload_optimizer) == ("linear", 100, "cpu")

    # The memory plan counts the offload: the adapter's Adam state (12 of its 16 bytes a parameter in
    # fp16) leaves the GPU, 0.06 -> 0.02 GiB for r16 on q/k/v/o of the 1.5B model.
    def lora_gib(*extra):
        shown = (
            CliRunner()
            .invoke(
                main,
                ["validate", str(CONFIGS / "gsm8k-lora-zero2.yaml"), "--gpu-memory-gb", "8", "--plan-only", *extra],
            )
            .output
        )
        return float(re.search(r"learner +weights .* LoRA ([0-9.]+) GiB", shown).group(1))

    assert lora_gib() == 0.02 and lora_gib("--set", "learner.offload_optimizer=null") == 0.06


@pytest.mark.parametrize("name", ["gsm8k-lora-zero2.yaml", "gsm8k-ref7b.yaml", "tldr.yaml"])
def test_founding_recipes_validate(name):
    # --plan-only: their models are hub ids and their GPUs are not on this machine (the checks of
    # what a run needs are training/preflight.py's, tested in tests/unit/training/test_preflight.py).
    result = CliRunner().invoke(main, ["validate", str(CONFIGS / name), "--plan-only"])
    assert result.exit_code == 0, result.output
    assert "# memory per GPU" in result.output and "not checked (--plan-only)" in result.output


# ---- grpo-ray validate ----------------------------------------------------------------------------


def test_validate_prints_polaris_plan_with_three_stages():
    result = CliRunner().invoke(main, ["validate", str(CONFIGS / "polaris.yaml"), "--plan-only"])
    assert result.exit_code == 0, result.output
    stages = result.output.split("# stages", 1)[1]
    for line in (
        r"stage1-40k\s+steps 1-400\s+max_new_tokens 39936\s+temperature 1\.4\s+top_p 1\s+eval temperature 1\.2",
        r"stage2-48k\s+steps 401-600\s+max_new_tokens 48128\s+temperature 1\.45\s+top_p 1\s+eval temperature 1\.4",
        r"stage3-52k\s+steps 601-700\s+max_new_tokens 52224\s+temperature 1\.5\s+top_p 1\s+eval temperature 1\.4",
    ):
        assert re.search(line, stages), line
    assert "substitution, rescue, drop-easy" in stages
    assert re.search(r"total\s+40 CPU, 8 GPU", result.output)
    assert "not checked (--plan-only)" in result.output


# ---- every field has its own comment ----------------------------------------------------------

# A mapping key at the start of a line, possibly as the first key of a list item ("- name: math").
KEY_LINE = re.compile(r"^\s*(?:-\s+)?[A-Za-z_][\w.-]*\s*:(?:\s|$)")


def uncommented_keys(text: str) -> list[str]:
    """Key lines whose previous non-blank line is neither a comment nor the start of a list item."""
    missing, previous = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if KEY_LINE.match(line) and not (previous and previous.startswith(("#", "- "))):
            missing.append(f"line {number}: {stripped}")
        previous = stripped
    return missing


def test_uncommented_keys_on_a_hand_example():
    text = (
        "# Seed.\n"
        "seed: 0\n"  # commented
        "\n"
        "model:\n"  # previous non-blank line is "seed: 0": missing
        "  # Hub id.\n"
        "  path: x\n"  # commented
        "stages:\n"  # previous line "path: x": missing
        "  - name: a\n"  # previous line "stages:": missing
        "    steps: 1\n"  # previous line starts a list item: allowed
        "    # e: 1 in a comment is not a key\n"
        "    temperature: 1.0\n"  # commented
    )
    assert uncommented_keys(text) == ["line 4: model:", "line 7: stages:", "line 8: - name: a"]


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=COMMENT_RULE_PENDING[p.name]))
        if p.name in COMMENT_RULE_PENDING
        else p
        for p in RECIPES
    ],
    ids=recipe_id,
)
def test_every_field_has_a_comment_directly_above(path):
    assert uncommented_keys(path.read_text()) == []


def test_the_real_model_distillation_recipe_reads_the_teacher_its_script_makes():
    cfg = load_config(CONFIGS / "smollm2-distill.yaml")
    (teacher,) = cfg.distillation.teachers
    script = (REPO / "scripts" / "make_smollm2_teacher.sh").read_text()
    made = REPO / re.search(r"\$\{1:-(\S+)\}", script).group(1) / "model"
    assert Path(teacher.model_path).resolve() == made.resolve()
    # The teacher is the arithmetic recipe trained longer: the same model, prompts and reward.
    arithmetic = load_config(CONFIGS / "smollm2-arithmetic.yaml")
    assert "configs/smollm2-arithmetic.yaml" in script
    assert (cfg.model.path, cfg.data.train_files, cfg.reward.functions) == (
        arithmetic.model.path,
        arithmetic.data.train_files,
        arithmetic.reward.functions,
    )
    assert not cfg.distillation.with_rewards
