"""A LoRA adapter as a peft folder (adapter_config.json + adapter_model.safetensors): what vLLM's
LoRA support loads (the vllm engine serves each synced adapter from one, actors/vllm_engine.py)."""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch


def write_adapter_folder(
    folder: str, weights: Iterable[tuple[str, torch.Tensor]], rank: int, alpha: float, target_modules: list[str]
) -> None:
    """Write the adapter's matrices (peft parameter names) and its config into a new `folder`."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    # peft's parameter names carry the adapter's name ("lora_A.default.weight"); its files do not.
    tensors = {name.replace(".default.", "."): tensor.detach().cpu().contiguous() for name, tensor in weights}
    os.makedirs(folder)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_modules, task_type="CAUSAL_LM").save_pretrained(folder)
