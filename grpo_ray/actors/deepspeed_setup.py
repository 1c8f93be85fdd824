"""What a learner rank hands DeepSpeed: its config dict and its optimizer, from the recipe's settings.

Mixed precision: model.dtype is the dtype of the module's parameters on every role. bfloat16 and
float16 turn on DeepSpeed's bf16 / fp16 mode (fp32 master weights in the optimizer; fp16 with
dynamic loss scaling: a step whose gradients overflow is skipped, counted in engine.skipped_steps,
reported as update/skipped = 1 like a NaN step, and the scale halves). The weight sync sends the
module's parameters as they are, so the rollout engines receive exactly the dtype they serve
(model.dtype); nothing is cast on the way.

Offload (learner.offload_optimizer / offload_params): ZeRO-Offload keeps the fp32 optimizer state
on the CPU and steps it there with DeepSpeed's CPU Adam (a C++ op compiled on first use, ~45 s,
into $TORCH_EXTENSIONS_DIR: this checkout's .cache/torch_extensions unless the variable is set, so
it is built once per checkout). fp16 on a CPU learner: DeepSpeed's CPU accelerator refuses it
unless the CPU has AVX512-FP16/AMX-FP16 ("Type fp16 is not supported on your device").

No DeepSpeed import at module level: the config is plain data, tested without it.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import torch

from grpo_ray.transport.bind import pin_default_gloo_interface, tcp_store

# Dynamic loss scaling: overflows in a row tolerated before the scale drops, and its floor
# (DeepSpeed's defaults, also TRL's and HF Trainer's when they pass "auto").
FP16_HYSTERESIS = 2
FP16_MIN_LOSS_SCALE = 1


def deepspeed_config(s, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config of a rank with LearnerSettings `s` in a world of `world_size` ranks."""
    zero: dict[str, Any] = {"stage": s.zero_stage}
    if s.offload_optimizer:
        # pin_memory speeds GPU <-> CPU copies but needs page-locked memory; off keeps small hosts safe.
        zero["offload_optimizer"] = {"device": s.offload_optimizer, "pin_memory": False}
    if s.offload_params:
        zero["offload_param"] = {"device": s.offload_params, "pin_memory": False}
    return {
        "train_micro_batch_size_per_gpu": s.micro_batch_size,
        "gradient_accumulation_steps": s.grad_accum_steps,
        "train_batch_size": s.micro_batch_size * s.grad_accum_steps * world_size,
        "zero_optimization": zero,
        "gradient_clipping": s.grad_clip,
        "bf16": {"enabled": s.dtype == "bfloat16"},
        "fp16": {
            "enabled": s.dtype == "float16",
            "loss_scale": s.loss_scale,
            "initial_scale_power": s.initial_scale_power,
            "loss_scale_window": s.loss_scale_window,
            "hysteresis": FP16_HYSTERESIS,
            "min_loss_scale": FP16_MIN_LOSS_SCALE,
        },
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # SkipNonFiniteAdamW is torch.optim.AdamW with a guard; DeepSpeed checks the class by name.
        "zero_allow_untested_optimizer": True,
    }


def build_optimizer(s, params: list) -> torch.optim.Optimizer:
    """DeepSpeed's CPU Adam (AdamW mode) under optimizer offload, else SkipNonFiniteAdamW: torch's
    AdamW, which starts in a second where CPU Adam compiles for ~45 s on first use."""
    if not s.offload_optimizer:
        return SkipNonFiniteAdamW(params, lr=s.lr, betas=s.betas, weight_decay=s.weight_decay)
    use_checkout_extensions_dir()
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam(params, lr=s.lr, betas=s.betas, weight_decay=s.weight_decay, adamw_mode=True)


def use_checkout_extensions_dir() -> None:
    """Build DeepSpeed's ops into this checkout's .cache/torch_extensions (git-ignored) unless
    TORCH_EXTENSIONS_DIR says otherwise; an installed package (no pyproject.toml beside it) keeps
    torch's default (~/.cache/torch_extensions)."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file():
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(checkout / ".cache" / "torch_extensions"))


def loss_scale(optimizer) -> float | None:
    """The current fp16 loss scale of DeepSpeed's wrapped optimizer (None without one)."""
    scale = getattr(optimizer, "cur_scale", None)
    if scale is None:
        scale = getattr(optimizer, "loss_scale", None)
    return float(scale) if scale is not None else None


class SkipNonFiniteAdamW(torch.optim.AdamW):
    """AdamW that leaves the weights alone when a gradient is NaN or infinite.

    Without ZeRO, DeepSpeed hands the step straight to the client optimizer, which would write the
    NaNs into the weights; it reads `overflow` afterwards and counts the step as skipped (as its
    ZeRO optimizers do on their own).
    """

    overflow = False

    @torch.no_grad()
    def step(self, closure=None):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        self.overflow = bool(grads) and not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
        if self.overflow:
            return None
        return super().step(closure)


def join_learner_world(rank: int, world_size: int, master_addr: str, master_port: int) -> None:
    """Join the learners' torch.distributed world (gloo on CPU, NCCL on GPU) for DeepSpeed."""
    import deepspeed
    import deepspeed.ops

    gpu = torch.cuda.is_available()
    # DeepSpeed JIT-builds its shared-memory allreduce op in every init_distributed, behind a
    # lock file that a learner killed mid-build leaves behind, after which every later run on
    # the machine waits on it forever (seen here). The op is only used when LOCAL_SIZE is set,
    # which we never do: skip building it.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK="0",
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
    )
    # Our own store and gloo interface, so the learners' world listens on master_addr's route
    # only (transport/bind.py); DeepSpeed then takes the initialised group as it is.
    pin_default_gloo_interface(master_addr)
    store = tcp_store(master_addr, master_port, world_size, rank == 0, datetime.timedelta(minutes=30))
    # On a GPU the world is bound to this process's device: NCCL otherwise guesses it from the rank
    # at the first barrier (a checkpoint's), warns "Guessing device ID based on global rank" on the
    # console, and a guess is wrong wherever ranks and GPUs do not line up. Ray gives each learner
    # its own GPU as the process's current one.
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else None
    backend = "nccl" if gpu else "gloo"
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world_size, device_id=device)
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)


def safe_checkpoint_engine():
    """DeepSpeed's torch checkpoint engine, loading with weights_only=True (its own load does not)."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    from grpo_ray.models.tensor_files import load_tensors

    class SafeCheckpointEngine(TorchCheckpointEngine):
        def load(self, path: str, map_location=None):
            return load_tensors(path, map_location)

    return SafeCheckpointEngine()
