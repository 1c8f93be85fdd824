"""The memory plan `grpo-ray validate` prints: per GPU of each role, what the recipe will hold.

Pure arithmetic on parameter counts, no torch and no model loading. The usual arithmetic, with
P parameters, b bytes per parameter of the recipe's dtype (float32 4, bfloat16/float16 2) and N
data-parallel learner ranks:

    weights     P x b                (ZeRO-3: / N; offloaded parameters: 0 on the GPU)
    gradients   P x b                (ZeRO-2 and 3: / N)
    optimizer   Adam: m and v in float32, 8 B/param, plus a float32 master copy (4 B/param) when
                the weights are 16-bit: 12 B/param in bf16/fp16, 8 in float32
                                     (ZeRO-1, 2 and 3: / N; offloaded optimizer: 0 on the GPU)
    so a full fine-tune in bf16 is 2 + 2 + 12 = 16 B/param: 49.4 GB (46.0 GiB) for Qwen2.5-3B.

With LoRA the base is frozen (weights only, no gradient or optimizer state; 0.5 B/param in 4bit,
1 in 8bit) and the adapter's L = sum over adapted matrices of r x (in + out) parameters carry
weights, gradients and Adam state: L x (b + b + 12). The rollout engine holds the weights (split
over its tensor-parallel GPUs) and vLLM gives the KV cache what gpu_memory_utilization leaves:
utilization x GPU - weights; a token's KV entry is 2 x layers x kv_heads x head_dim x b.
Activations are not estimated (they grow with micro_batch_size x sequence length; see
learner.gradient_checkpointing). GiB = 2^30 bytes throughout.

Parameter counts come from the model folder's config.json, or from `ARCHITECTURES` for hub ids
that cannot be read offline (Qwen2.5 sizes, the tiny model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from grpo_ray.config.schema import Config

GIB = 1 << 30
# config.json fields of the Qwen2.5 family and the built-in models, for hub ids and built-in names.
_QWEN = {"model_type": "qwen2", "vocab_size": 151936, "tie_word_embeddings": True}
_QWEN_HALF_B = {
    **_QWEN,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
}
# The built-in tiny models (models/tiny.py's build_tiny_model): one shape, their vocabularies apart.
_TINY = {
    "model_type": "qwen2",
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}
ARCHITECTURES: dict[str, dict] = {
    "tiny": {**_TINY, "vocab_size": 55},
    "tiny-tools": {**_TINY, "vocab_size": 59},
    # The built-in real model (models/smollm2.py), and the hub's HuggingFaceTB/SmolLM2-135M-Instruct.
    "smollm2-135m": {
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "tie_word_embeddings": True,
    },
    "qwen2.5-0.5b": _QWEN_HALF_B,
    # Qwen2-0.5B has the same shape as Qwen2.5-0.5B.
    "qwen2-0.5b": _QWEN_HALF_B,
    "qwen2.5-1.5b": {
        **_QWEN,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
    },
    "qwen2.5-3b": {
        **_QWEN,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
    },
    "qwen2.5-7b": {
        **_QWEN,
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
    },
}
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_QUANTIZED_BYTES = {"4bit": 0.5, "8bit": 1.0}


@dataclass(frozen=True)
class Architecture:
    """A Qwen2/Llama-style decoder: q/k/v/o attention (bias on q/k/v when qkv_bias) and a SwiGLU MLP."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool
    qkv_bias: bool

    @staticmethod
    def from_config(config: dict) -> Architecture:
        heads = int(config["num_attention_heads"])
        return Architecture(
            vocab=int(config["vocab_size"]),
            hidden=int(config["hidden_size"]),
            intermediate=int(config["intermediate_size"]),
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            tied=bool(config.get("tie_word_embeddings")),
            qkv_bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias")),
        )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def matrix_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one decoder layer, by module name."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        return {
            "q_proj": (h, h),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (h, h),
            "gate_proj": (h, self.intermediate),
            "up_proj": (h, self.intermediate),
            "down_proj": (self.intermediate, h),
        }

    @property
    def parameters(self) -> int:
        shapes = self.matrix_shapes()
        bias = sum(shapes[name][1] for name in ("q_proj", "k_proj", "v_proj")) if self.qkv_bias else 0
        per_layer = sum(i * o for i, o in shapes.values()) + bias + 2 * self.hidden  # two RMSNorms
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * per_layer + self.hidden  # final norm

    def lora_parameters(self, rank: int, target_modules: tuple[str, ...]) -> int:
        """r x (in + out) per adapted matrix; a target is a module-name suffix, as peft matches."""
        shapes = self.matrix_shapes()
        return self.layers * sum(rank * (i + o) for name, (i, o) in shapes.items() if name in target_modules)

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def find_architecture(path: str) -> Architecture | None:
    """From `path`/config.json when it is a local folder, else `ARCHITECTURES` by hub id; None if unknown."""
    config_file = Path(path).expanduser() / "config.json"
    if config_file.is_file():
        return Architecture.from_config(json.loads(config_file.read_text()))
    name = path.rsplit("/", 1)[-1].lower().removesuffix("-instruct")
    return Architecture.from_config(ARCHITECTURES[name]) if name in ARCHITECTURES else None


@dataclass(frozen=True)
class LearnerMemory:
    """Bytes per learner GPU, each part after ZeRO sharding and offload."""

    weights: float
    gradients: float
    optimizer: float
    lora: float  # the adapter's weights + gradients + Adam state (0 without LoRA)
    # Of the above, Adam's m and v and the gradients (the adapter's, with LoRA): what
    # learner.offload_states_between_updates keeps in host memory between updates.
    moments_and_gradients: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.lora


def learner_memory(
    parameters: int,
    dtype: str,
    ranks: int,
    zero_stage: int,
    lora_parameters: int = 0,
    quantization: str | None = None,
    offload_optimizer: bool = False,
    offload_params: bool = False,
) -> LearnerMemory:
    """Per-GPU bytes of one learner rank; ``lora_parameters`` > 0 means LoRA (frozen base)."""
    b = _DTYPE_BYTES[dtype]
    adam = 8 + (4 if b < 4 else 0)  # m, v, and a float32 master copy of 16-bit weights
    moments = 0 if offload_optimizer else 8
    if lora_parameters:
        base = parameters * (_QUANTIZED_BYTES[quantization] if quantization else b)
        return LearnerMemory(
            base,
            0.0,
            0.0,
            lora_parameters * (b + b + (0 if offload_optimizer else adam)),
            lora_parameters * (b + moments),
        )
    weights = 0.0 if offload_params else parameters * b / (ranks if zero_stage == 3 else 1)
    gradients = parameters * b / (ranks if zero_stage >= 2 else 1)
    optimizer = 0.0 if offload_optimizer else parameters * adam / (ranks if zero_stage >= 1 else 1)
    return LearnerMemory(
        weights, gradients, optimizer, 0.0, gradients + parameters * moments / (ranks if zero_stage >= 1 else 1)
    )


def rollout_memory(
    arch: Architecture, dtype: str, tensor_parallel: int, gpu_bytes: float, utilization: float, lora_parameters: int = 0
) -> tuple[float, float, float]:
    """(weights, LoRA adapter, KV cache) bytes per rollout GPU: vLLM gives the KV cache what
    `utilization` of the GPU leaves after the weights (negative: the weights alone do not fit)."""
    b = _DTYPE_BYTES[dtype]
    weights = arch.parameters * b / tensor_parallel
    adapter = lora_parameters * b / tensor_parallel
    return weights, adapter, utilization * gpu_bytes - weights - adapter


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.2f} GiB"


# A hub id not in ARCHITECTURES: said as a fact of the plan, not as an error (the run may be fine).
SIZE_NOT_KNOWN = "its size is not known here (no local config.json, and not in grpo-ray's table), so no memory plan"


def memory_plan(cfg: Config, gpu_memory_gb: float) -> tuple[list[str], list[str]]:
    """(lines, warnings) of `grpo-ray validate`'s memory plan; GPU roles are checked against
    ``gpu_memory_gb`` GiB per GPU, colocated roles together."""
    gpu = gpu_memory_gb * GIB
    policy = find_architecture(cfg.model.path)
    if policy is None:
        return [f"policy {cfg.model.path}: {SIZE_NOT_KNOWN}"], []
    lora = cfg.model.lora
    adapter = policy.lora_parameters(lora.rank, tuple(lora.target_modules)) if lora.enabled else 0
    lines = [
        f"policy {cfg.model.path}: {policy.parameters / 1e6:,.1f} M parameters"
        + (f", LoRA r{lora.rank} {adapter / 1e6:.2f} M" if adapter else "")
    ]
    per_gpu: dict[str, float] = {}
    ln = cfg.learner
    learner = learner_memory(
        policy.parameters,
        cfg.model.dtype,
        ln.num_workers,
        ln.zero_stage,
        adapter,
        cfg.model.quantization,
        offload_optimizer=ln.offload_optimizer == "cpu",
        offload_params=ln.offload_params == "cpu",
    )
    per_gpu["learner"] = learner.total
    lines.append(
        f"learner      weights {_gib(learner.weights)}  gradients {_gib(learner.gradients)}  optimizer "
        f"{_gib(learner.optimizer)}  LoRA {_gib(learner.lora)}  total {_gib(learner.total)} per rank "
        f"({ln.num_workers} rank{'s' if ln.num_workers > 1 else ''}, ZeRO-{ln.zero_stage}; activations not counted)"
    )
    r = cfg.rollout
    utilization = r.vllm.gpu_memory_utilization if r.backend == "vllm" and r.num_gpus > 0 else 0.0
    weights, adapter_bytes, kv = rollout_memory(
        policy, cfg.model.dtype, r.tensor_parallel_size, gpu, utilization, adapter
    )
    per_gpu["rollout"] = max(weights + adapter_bytes, utilization * gpu)
    kv_text = (
        f"KV cache {_gib(kv)} ({max(kv, 0) / policy.kv_bytes_per_token(_DTYPE_BYTES[cfg.model.dtype]):,.0f} tokens)"
        if utilization
        else "KV cache grows with the batch (no vLLM GPU pre-allocation)"
    )
    lines.append(f"rollout      weights {_gib(weights)}  LoRA {_gib(adapter_bytes)}  {kv_text} per GPU")
    if cfg.use_reference:
        ref = find_architecture(cfg.reference.model_path or cfg.model.path)
        if ref is not None:
            per_gpu["reference"] = ref.parameters * _DTYPE_BYTES[cfg.model.dtype]
            lines.append(
                f"reference    weights {_gib(per_gpu['reference'])} ({cfg.reference.model_path or 'the policy'})"
            )
    if utilization and _shares_gpu(cfg, "learner", "rollout"):
        beside = per_gpu.get("reference", 0.0) if _shares_gpu(cfg, "learner", "reference") else 0.0
        away = learner.moments_and_gradients if ln.offload_states_between_updates else 0.0
        lines += phase_lines(
            learner.total + beside,
            utilization,
            gpu,
            r.vllm.sleep_level,
            "learner and reference" if beside else "learner",
            away,
        )
    return lines, _memory_warnings(cfg, per_gpu, gpu, kv if utilization else None)


def _shares_gpu(cfg: Config, role: str, other: str) -> bool:
    """Whether two GPU roles sit on one GPU: colocated, or both on fractions of one (Ray packs them
    onto a node's GPU, as configs/gsm8k.yaml does on a one-GPU machine)."""
    gpus = {"learner": cfg.learner.num_gpus, "rollout": cfg.rollout.num_gpus, "reference": cfg.reference.num_gpus}
    if gpus[role] <= 0 or gpus[other] <= 0:
        return False
    return {role, other} <= set(cfg.placement.colocate) or (gpus[role] < 1 and gpus[other] < 1)


# Kept free on a GPU the learner and a vLLM engine take in turns: each process's CUDA context
# and what a sleeping engine keeps (its allocator's bookkeeping, non-pool buffers).
TURN_RESERVE = 2 * GIB


def phase_lines(
    learner_total: float, utilization: float, gpu: float, sleep_level: int, holder: str = "learner", away: float = 0.0
) -> list[str]:
    """The two phases of a GPU shared by learner and vLLM (placement.colocate): what each holds while
    the engine generates and while the learners update, and how much of the GPU vLLM could take.
    Asleep (rollout.vllm.sleep_level), the engine gives all of its memory to the update, so it may
    take everything the learners' state leaves; awake, its share is missing from the update's room
    for activations the whole run. learner_total: the learners' state (and a reference beside them),
    named `holder`; `away` of it waits in host memory while the engine is awake
    (learner.offload_states_between_updates)."""
    engine = utilization * gpu
    during_update = 0.0 if sleep_level else engine
    room = gpu - learner_total - during_update
    during_rollout = learner_total - away
    largest = max(0.0, (gpu - during_rollout - TURN_RESERVE) / gpu)
    kept = f" ({_gib(away)} of moments and gradients in host memory)" if away else ""
    lines = [
        f"one GPU in two phases (rollout.vllm.sleep_level {sleep_level}): rollout: {holder} "
        f"{_gib(during_rollout)}{kept} + "
        f"vLLM {_gib(engine)} = {_gib(during_rollout + engine)}; update: {holder} {_gib(learner_total)} + vLLM "
        f"{_gib(during_update)}"
        + (
            " (asleep: " + ("weights in host memory" if sleep_level == 1 else "weights dropped") + ")"
            if sleep_level
            else " (awake)"
        )
        + f", {_gib(room)} left for activations",
    ]
    if sleep_level:
        lines.append(
            f"vLLM may take up to gpu_memory_utilization {largest:.2f} (the GPU less the {holder}'s "
            f"{_gib(during_rollout)} and {_gib(TURN_RESERVE)} kept for CUDA contexts)"
        )
    else:
        lines.append(
            f"with rollout.vllm.sleep_level 1 the update would have {_gib(gpu - learner_total)} for activations, "
            f"or vLLM up to gpu_memory_utilization {largest:.2f}"
        )
    return lines


def _memory_warnings(cfg: Config, per_gpu: dict[str, float], gpu: float, kv: float | None) -> list[str]:
    gpus = {"learner": cfg.learner.num_gpus, "rollout": cfg.rollout.num_gpus, "reference": cfg.reference.num_gpus}
    warnings = []
    if kv is not None and kv <= 0:
        warnings.append(
            f"rollout: the weights do not fit in rollout.vllm.gpu_memory_utilization "
            f"{cfg.rollout.vllm.gpu_memory_utilization:g} of the GPU; raise it or use more tensor_parallel_size"
        )
    colocated = [role for role in cfg.placement.colocate if role in per_gpu and gpus[role] > 0]
    if len(colocated) > 1 and sum(per_gpu[role] for role in colocated) > gpu:
        total = sum(per_gpu[role] for role in colocated)
        warnings.append(
            f"{' + '.join(colocated)} share a GPU and need {_gib(total)}, more than --gpu-memory-gb {gpu / GIB:g}"
        )
    for role, need in per_gpu.items():
        if gpus[role] > 0 and role not in colocated and need > gpu:
            warnings.append(f"{role} needs {_gib(need)} per GPU, more than --gpu-memory-gb {gpu / GIB:g}")
    return warnings
