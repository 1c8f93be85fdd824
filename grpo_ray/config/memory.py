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
utilization x GPU - weights; a token's KV entry is 2 x layers x kv_heads x head_dim x b. The
reference and each teacher (distillation.teachers) hold their weights alone, P' x b, on their own
GPU or beside the learner's state on its GPU (a fraction of one each, or colocated).
What grows with the vocabulary is counted per role (config/vocab_memory.py): the learner's and each
scorer's log-prob pass over a micro-batch (a chunk of it when the head is chunked), the rollout
engine's decoding step (inside vLLM's gpu_memory_utilization, so taken from its KV cache).
Activations are not estimated here (they grow with micro_batch_size x sequence length; see
learner.gradient_checkpointing): the CPU's arithmetic (config/activation_memory.py) is PyTorch's CPU
attention kernel's, which keeps each layer's mask, not a GPU's flash-attention's. GiB = 2^30 bytes throughout.
Roles on the CPU: config/host_memory.py, which counts the learner's activations.

Parameter counts come from the model folder's config.json, or from config/architectures.py's
`ARCHITECTURES` for hub ids that cannot be read offline (Qwen2.5 sizes, the tiny model).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_ray.config.architectures import Architecture, find_architecture
from grpo_ray.config.distillation import TeacherConfig
from grpo_ray.config.schema import Config
from grpo_ray.config.vocab_memory import VocabTerm, sampling_vocab, scoring_vocab

GIB = 1 << 30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_QUANTIZED_BYTES = {"4bit": 0.5, "8bit": 1.0}


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
    b = DTYPE_BYTES[dtype]
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
    b = DTYPE_BYTES[dtype]
    weights = arch.parameters * b / tensor_parallel
    adapter = lora_parameters * b / tensor_parallel
    return weights, adapter, utilization * gpu_bytes - weights - adapter


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.2f} GiB"


def vocab_text(term: VocabTerm) -> str:
    """ "logits 0.28 GiB (3 x [512, 49152] float32, chunks of 512)"."""
    return f"logits {_gib(term.bytes)} ({term.copies} x [{term.positions}, {term.vocab}] float32, {term.path})"


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
    per_gpu: dict[str, float] = {}  # what each role holds through the step
    passes: dict[str, float] = {}  # and the vocabulary-sized tensors of its own pass, on top for a while
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
    logits = scoring_vocab(cfg, policy, with_grad=True)
    per_gpu["learner"], passes["learner"] = learner.total, logits.bytes
    lines.append(
        f"learner      weights {_gib(learner.weights)}  gradients {_gib(learner.gradients)}  optimizer "
        f"{_gib(learner.optimizer)}  LoRA {_gib(learner.lora)}  total {_gib(learner.total)} per rank "
        f"({ln.num_workers} rank{'s' if ln.num_workers > 1 else ''}, ZeRO-{ln.zero_stage}); {vocab_text(logits)}; "
        "activations not counted"
    )
    r = cfg.rollout
    utilization = r.vllm.gpu_memory_utilization if r.backend == "vllm" and r.num_gpus > 0 else 0.0
    row, kv = _rollout_row(cfg, policy, adapter, gpu, utilization, per_gpu, passes)
    lines.append(row)
    lines += _scoring_rows(cfg, per_gpu, passes, gpu)
    if utilization and _shares_gpu(cfg, "learner", "rollout"):
        # The reference and teachers on the learner's GPU hold their weights through both phases.
        beside = [role for role in _scoring_roles(cfg) if role in per_gpu and _shares_gpu(cfg, "learner", role)]
        away = learner.moments_and_gradients if ln.offload_states_between_updates else 0.0
        lines += phase_lines(
            learner.total + sum(per_gpu[role] for role in beside),
            utilization,
            gpu,
            r.vllm.sleep_level,
            _listed(["learner", *beside]),
            away,
        )
    return lines, _memory_warnings(cfg, per_gpu, passes, gpu, kv if utilization else None)


def _rollout_row(
    cfg: Config,
    policy: Architecture,
    adapter: int,
    gpu: float,
    utilization: float,
    per_gpu: dict[str, float],
    passes: dict[str, float],
) -> tuple[str, float]:
    """(the rollout's row, its vLLM KV cache per GPU): weights, adapter, a decoding step's logits;
    what it holds and its pass go into `per_gpu` and `passes`."""
    weights, adapter_bytes, kv = rollout_memory(
        policy, cfg.model.dtype, cfg.rollout.tensor_parallel_size, gpu, utilization, adapter
    )
    sampling = sampling_vocab(cfg, policy)
    kv -= sampling.bytes  # vLLM profiles its sampler inside its share: the KV cache gets the rest
    per_gpu["rollout"] = max(weights + adapter_bytes, utilization * gpu)
    passes["rollout"] = 0.0 if utilization else sampling.bytes
    kv_text = (
        f"KV cache {_gib(kv)} ({max(kv, 0) / policy.kv_bytes_per_token(DTYPE_BYTES[cfg.model.dtype]):,.0f} tokens)"
        if utilization
        else "KV cache grows with the batch (no vLLM GPU pre-allocation)"
    )
    row = f"rollout      weights {_gib(weights)}  LoRA {_gib(adapter_bytes)}  {vocab_text(sampling)}  {kv_text} per GPU"
    return row, kv


def _scoring_roles(cfg: Config) -> dict[str, tuple[str, str]]:
    """role -> (model, as its row names it) of each model held here only for its log-probs: the
    reference (algorithm.kl_coef > 0) and each teacher run here (a url teacher's model is its server's)."""
    roles = {"reference": (cfg.reference.model_path or cfg.model.path, cfg.reference.model_path or "the policy")}
    roles = roles if cfg.use_reference else {}
    return roles | {
        f"teacher-{t.name}": (t.model_path, t.model_path) for t in cfg.distillation.teachers if not t.served
    }


def _scoring_rows(cfg: Config, per_gpu: dict[str, float], passes: dict[str, float], gpu: float) -> list[str]:
    """One row per scoring model: its weights at model.dtype, or the share of the GPU its vLLM
    engine takes (added to `per_gpu`), and where they are when not on a GPU of their own (the CPU,
    or the learner's GPU); one whose size is not known says so; a url teacher takes no memory here."""
    lines = []
    engines = {f"teacher-{t.name}": t for t in cfg.distillation.teachers if t.backend == "vllm"}
    for role, (path, shown) in _scoring_roles(cfg).items():
        arch = find_architecture(path)
        if arch is None:
            lines.append(f"{role:<12} {path}: {SIZE_NOT_KNOWN}")
            continue
        weights = arch.parameters * DTYPE_BYTES[cfg.model.dtype]
        on_gpu = bool(_role_gpus(cfg)[role])
        where = "" if on_gpu else ", on the CPU"
        where = ", on the learner's GPU" if _shares_gpu(cfg, "learner", role) else where
        per_gpu[role], engine = _teacher_engine(engines.get(role), weights, gpu if on_gpu else 0.0)
        if role not in engines:  # a vLLM engine's log-prob pass is inside its own share
            logits = scoring_vocab(cfg, arch, with_grad=False)
            passes[role] = logits.bytes
            engine = f"; {vocab_text(logits)}"
        lines.append(f"{role:<12} weights {_gib(weights)} ({shown}{where}){engine}")
    return lines + served_teacher_lines(cfg)


def served_teacher_lines(cfg: Config) -> list[str]:
    """A row for each teacher served at a url: it takes no memory here (both plans say so)."""
    return [
        f"{'teacher-' + t.name:<12} served at {t.shown}: no memory here" for t in cfg.distillation.teachers if t.served
    ]


def _teacher_engine(engine: TeacherConfig | None, weights: float, gpu: float) -> tuple[float, str]:
    """(bytes on its GPU, what its row adds) of a scoring model: its weights alone, or the vLLM
    engine of `engine` (a teacher of backend vllm), which takes gpu_memory_utilization of the GPU
    (`gpu` bytes; 0: on the CPU, where its KV cache takes cpu_kv_cache_gb of host memory)."""
    if engine is None:
        return weights, ""
    if not gpu:
        return weights, f"; vLLM's KV cache {engine.cpu_kv_cache_gb:g} GiB in host memory"
    taken = engine.gpu_memory_utilization * gpu
    return max(weights, taken), (
        f"; vLLM takes {_gib(taken)} (gpu_memory_utilization {engine.gpu_memory_utilization:g}), "
        f"KV cache {_gib(taken - weights)}"
    )


def _listed(names: list[str]) -> str:
    """ "learner", "learner and reference", "learner, reference and teacher-big"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _shares_gpu(cfg: Config, role: str, other: str) -> bool:
    """Whether two GPU roles sit on one GPU: colocated, or both on fractions of one (Ray packs them
    onto a node's GPU, as configs/gsm8k.yaml does on a one-GPU machine)."""
    gpus = _role_gpus(cfg)
    if gpus[role] <= 0 or gpus[other] <= 0:
        return False
    return {role, other} <= set(cfg.placement.colocate) or (gpus[role] < 1 and gpus[other] < 1)


def _role_gpus(cfg: Config) -> dict[str, float]:
    """num_gpus of each role the memory plan counts, by role name (a teacher's: teacher-<name>)."""
    teachers = {f"teacher-{t.name}": t.num_gpus for t in cfg.distillation.teachers if not t.served}
    return {"learner": cfg.learner.num_gpus, "rollout": cfg.rollout.num_gpus, "reference": cfg.reference.num_gpus} | (
        teachers
    )


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


def _needed(roles: list[str], per_gpu: dict[str, float], passes: dict[str, float]) -> float:
    """What roles on one GPU need together: all they hold, and the largest one pass among them (the
    learner's, the reference's and a teacher's log-prob passes come one after the other)."""
    return sum(per_gpu[role] for role in roles) + max(passes.get(role, 0.0) for role in roles)


def _memory_warnings(
    cfg: Config, per_gpu: dict[str, float], passes: dict[str, float], gpu: float, kv: float | None
) -> list[str]:
    gpus = _role_gpus(cfg)
    warnings = []
    if kv is not None and kv <= 0:
        warnings.append(
            f"rollout: the weights do not fit in rollout.vllm.gpu_memory_utilization "
            f"{cfg.rollout.vllm.gpu_memory_utilization:g} of the GPU; raise it or use more tensor_parallel_size"
        )
    for i, t in enumerate(cfg.distillation.teachers):
        arch = find_architecture(t.model_path) if t.backend == "vllm" and t.num_gpus else None
        if arch and arch.parameters * DTYPE_BYTES[cfg.model.dtype] >= t.gpu_memory_utilization * gpu:
            warnings.append(
                f"teacher-{t.name}: the weights leave no KV cache in distillation.teachers.{i}."
                f"gpu_memory_utilization {t.gpu_memory_utilization:g} of the GPU; raise it"
            )
    colocated = [role for role in cfg.placement.colocate if role in per_gpu and gpus[role] > 0]
    if len(colocated) > 1 and (total := _needed(colocated, per_gpu, passes)) > gpu:
        warnings.append(
            f"{' + '.join(colocated)} share a GPU and need {_gib(total)}, more than --gpu-memory-gb {gpu / GIB:g}"
        )
    for role in per_gpu:
        need = _needed([role], per_gpu, passes)
        if gpus[role] > 0 and role not in colocated and need > gpu:
            warnings.append(f"{role} needs {_gib(need)} per GPU, more than --gpu-memory-gb {gpu / GIB:g}")
    # A teacher on a fraction of the learner's GPU: its weights beside what the learner's GPU holds.
    beside = [role for role in _scoring_roles(cfg) if role in per_gpu and _shares_gpu(cfg, "learner", role)]
    if any(role.startswith("teacher-") for role in beside):
        shared = list(dict.fromkeys([*(colocated if "learner" in colocated else ["learner"]), *beside]))
        if (total := _needed(shared, per_gpu, passes)) > gpu:
            warnings.append(
                f"{' + '.join(shared)} share a GPU and need {_gib(total)}, more than --gpu-memory-gb {gpu / GIB:g}"
            )
    return warnings
