"""Which models' LM head the fused log-prob paths may take over (models/chunked_logprobs.py for the
torch path, models/liger_logprobs.py for liger's): both ask here, so neither imports the other."""

from __future__ import annotations

import torch

# Architectures whose causal-LM forward is exactly lm_head(decoder(...)) with a plain nn.Linear head.
# Gemma 3's is too when its config has no final_logit_softcapping (Gemma 3's has none; Gemma 2's caps
# the logits with a tanh, and is refused by that field below).
PLAIN_HEAD_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral", "gemma3_text"})


def plain_lm_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The LM head when the model's logits are lm_head(last hidden state) and nothing else, else None."""
    module = getattr(model, "module", model)  # a DeepSpeed engine wraps the model
    config = getattr(module, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_TYPES:
        return None
    if getattr(config, "final_logit_softcapping", None) is not None:
        return None
    head = module.get_output_embeddings()
    # A peft LoRA layer on lm_head is a subclass-free wrapper, not an nn.Linear: refused.
    if type(head) is not torch.nn.Linear or hasattr(head.weight, "ds_id"):
        return None
    return head
