"""model.quantization: a bitsandbytes-quantised base under a trained LoRA adapter (QLoRA, 8-bit).

The learner loads the base quantised (4bit: NF4 with double quantisation and compute in the
recipe's dtype, as the QLoRA paper and TRL's examples do; 8bit: LLM.int8()), prepares it for
k-bit training (peft: norms and embeddings in float32, input gradients on) and trains only the
adapter. The weight sync sends the adapter only; the rollout engine serves the unquantised base at
the recipe's dtype plus the adapter, so its log-probs differ a little from the learner's
(quantisation error): `sync/probe_max_abs_diff` shows it and `algorithm.tis_cap` corrects for it.

Whether bitsandbytes can run is checked before anything starts (`quantization_problem`), by a real
quantisation of a small tensor where the learners will run: measured with bitsandbytes 0.50.2 on
this CPU-only machine, 4bit and 8bit quantise, and LoRA trains over them, on the CPU backend.
"""

from __future__ import annotations

import torch

from grpo_ray.errors import first_line

# Side of the square tensor quantised as a probe: a multiple of every bitsandbytes block size.
_PROBE_SIZE = 64


def quantization_problem(kind: str | None, learners_on_gpu: bool) -> str | None:
    """None when ``kind`` can run where the learners run, else one line saying why not.

    With learners on GPUs and no GPU here (a Ray head node), only the install is checked: the
    CUDA probe runs in the learner when it loads the model.
    """
    if kind is None:
        return None
    try:
        import bitsandbytes
        import bitsandbytes.functional as functional
    except Exception as err:  # ImportError, or a broken native library raising at import
        return (
            f"model.quantization: {kind} needs bitsandbytes, which cannot be imported here "
            f"({first_line(err, with_type=True, limit=200)}); "
            "pip install 'grpo-ray[quant]' or remove model.quantization"
        )
    if learners_on_gpu and not torch.cuda.is_available():
        return None
    device = "cuda" if learners_on_gpu else "cpu"
    probe = torch.randn(_PROBE_SIZE, _PROBE_SIZE, device=device)
    try:
        if kind == "4bit":
            functional.quantize_4bit(probe, quant_type="nf4")
        else:
            functional.int8_vectorwise_quant(probe.half())
    except Exception as err:  # bitsandbytes without a backend for this device
        return (
            f"model.quantization: bitsandbytes {bitsandbytes.__version__} cannot quantise on {device} here "
            f"({first_line(err, with_type=True, limit=200)}); use a version with a {device} backend "
            "(>= 0.50 for CPU), a CUDA GPU, "
            "or remove model.quantization"
        )
    return None


def bitsandbytes_config(kind: str, dtype: str):
    """The transformers quantisation config of ``kind`` ("4bit" | "8bit"), computing in ``dtype``."""
    from transformers import BitsAndBytesConfig

    if kind == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=getattr(torch, dtype),
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def prepare_for_adapter_training(model: torch.nn.Module) -> torch.nn.Module:
    """peft's k-bit preparation: frozen quantised base, float32 norms, input gradients for LoRA;
    and 4bit layers kept in their trainable layout (`keep_trainable_4bit_layout`)."""
    from peft import prepare_model_for_kbit_training

    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    keep_trainable_4bit_layout(model)
    return model


def keep_trainable_4bit_layout(model: torch.nn.Module) -> int:
    """Turn off bitsandbytes' CPU inference repacking on every 4bit layer; returns how many.

    On a CPU with AVX512-BF16, bitsandbytes (0.50) repacks a Linear4bit's weight into an
    inference-only layout the first time the layer runs in eval mode without gradients (the
    learner's `score`), and never packs it back: every later training forward then takes the
    inference kernel and fails in `matmul_4bit` ("a view of a leaf Variable that requires grad is
    being used in an in-place operation"). A learner trains over these layers, so they keep the
    layout their autograd path reads; CPUs without AVX512-BF16 never repack.
    """
    count = 0
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
            count += 1
    return count
