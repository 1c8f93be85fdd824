"""What the learner's autograd keeps of one micro-batch's forward until its backward: the activations,
at their peak when the forward ends (the LM head's chunks come on top: config/vocab_memory.py; the
weights' gradients are the model state's: config/memory.learner_memory). Pure arithmetic, added to the
host plan's learner row (config/host_memory.py).

Read from transformers 5.19's Llama/Qwen/Gemma 3 decoder layers under PyTorch 2.13's CPU
scaled_dot_product_attention, and checked to the byte: tests/unit/config/test_activation_memory.py
counts what autograd saves (torch.autograd.graph.saved_tensors_hooks) in small Llama and Gemma 3
models through each of the learner's forwards. Which forward runs is models/'s choice, restated here:
  full      every row padded to the micro-batch's longest, rows x (prompt + completion) positions
  shared    learner.share_prompts (models/shared_prompts.py): each distinct prompt but its last token
            runs once, then each row's last prompt token and completion attend to that pass's keys,
            indexed out to the rows and kept in the KV cache until the forward ends; not under
            gradient checkpointing or packing, nor for a model whose cache drops keys (sliding layers)
  packed    learner.packing (models/packing.py): the micro-batch's rows end to end in one row, under
            one [positions, positions] block-causal mask
  learner.gradient_checkpointing keeps each layer's input alone and recomputes one layer at a time in
  the backward. Sequence lengths are the recipe's bounds (data.max_prompt_tokens + max_new_tokens):
  a run's prompts are often shorter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpo_ray.config.architectures import Architecture
from grpo_ray.config.plans import plan_batches, plan_stages
from grpo_ray.config.schema import Config
from grpo_ray.config.vocab_memory import F32, micro_batch_positions


def layer_activation_bytes(arch: Architecture, dtype_bytes: int, queries: int, keys: int, masked: int) -> float:
    """Bytes autograd keeps for the backward of one decoder layer that runs `queries` positions whose
    attention reads `keys` key/value positions, `masked` being the [query, key] pairs of its mask
    (summed over rows). Elements at the model's dtype unless said:

    per query position
      each RMSNorm (norms_per_layer of hidden; with qk_norm one of head_dim per head on q and on k):
        its input in float32 (norms compute in float32), the normalised tensor, and 1 / rms in float32
      the normed inputs that q/k/v and gate/up keep for their weights' gradients: 2 x hidden
      the rotated queries and the attention's output: 2 x heads x head_dim (the CPU kernel writes its
        output in the layout o_proj reads, so o_proj's input is that same tensor), and the kernel's
        logsumexp, heads in float32
      the MLP's gate and up outputs, act(gate), and act(gate) x up (down_proj's input): 4 x intermediate
    per key position: its key and value as the kernel reads them, 2 x kv_heads x head_dim, or
      2 x heads x head_dim where transformers copies them to every query head (a masked CPU SDPA has no
      grouped-query path; a single kv head repeats as a view, no copy)
    per masked pair: the mask, which the CPU kernel keeps in every layer as a tensor of the dtype.

    Not kept, so not counted: attention probabilities (SDPA's CPU flash kernel recomputes them from
    q, k and the logsumexp; eager attention, which the learner does not ask for, would keep heads x keys
    of them per query). Gemma's norms keep their normalised tensor in float32 as well: in 16-bit
    this counts 2 B per element too few for them. LoRA is counted as full fine-tuning (the adapters
    keep the same inputs; the frozen base keeps fewer)."""
    b = dtype_bytes
    q_dim, kv_dim = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    normed = arch.norms_per_layer * arch.hidden + (q_dim + kv_dim if arch.qk_norm else 0)
    norm_rows = arch.norms_per_layer + (arch.heads + arch.kv_heads if arch.qk_norm else 0)
    per_query = (
        normed * (F32 + b)
        + norm_rows * F32
        + 2 * arch.hidden * b
        + 2 * q_dim * b
        + arch.heads * F32
        + 4 * arch.intermediate * b
    )
    per_key = 2 * (q_dim if repeats_kv(arch) else kv_dim) * b
    return float(queries * per_query + keys * per_key + masked * b)


def repeats_kv(arch: Architecture) -> bool:
    """Whether transformers copies each kv head's keys and values to its query heads for SDPA."""
    return 1 < arch.kv_heads < arch.heads


@dataclass(frozen=True)
class ActivationTerm:
    """The activations of one learner micro-batch of `rows` x `tokens` positions (packed: one row)."""

    bytes: float
    rows: int
    tokens: int
    how: str  # which forward: "", "8 prompts once", "packed", "checkpointed"


def learner_activations(cfg: Config, arch: Architecture, dtype_bytes: int) -> ActivationTerm:
    """The recipe's learner micro-batch (the module docstring's forwards): its rows and positions,
    each layer's `layer_activation_bytes`, and what gradient checkpointing or a shared prompt pass
    changes."""
    ln, group = cfg.learner, cfg.rollout.samples_per_prompt
    prompt = cfg.data.max_prompt_tokens
    length = prompt + max(stage.max_new_tokens for stage in plan_stages(cfg))
    positions = micro_batch_positions(plan_batches(cfg).micro_batch_size, length, ln.max_tokens_per_micro_batch)
    rows = max(1, positions // length)
    # Rows in batch order hold whole groups of `group` samples: a micro-batch that is not a multiple
    # of the group may start inside one, so one prompt more.
    prompts = min(rows, math.ceil(rows / group) + (rows % group > 0))
    shared = (
        ln.share_prompts
        and not (ln.gradient_checkpointing or ln.packing or ln.max_tokens_per_micro_batch or arch.sliding_layers)
        and prompt > 1
        and prompts < rows
    )
    cache = 0.0
    if ln.packing:
        rows, length, how = 1, positions, "packed"
        queries = keys = positions
        masked = positions * positions
    elif shared:
        prefix, rest = prompt - 1, length - prompt + 1
        queries, keys = prompts * prefix + rows * rest, prompts * prefix + rows * length
        masked = prompts * prefix * prefix + rows * rest * length
        # The cache's keys and values until the forward ends: the very tensors the kernel keeps,
        # unless they were copied to every query head.
        cache = rows * arch.kv_bytes(length, dtype_bytes) if repeats_kv(arch) else 0.0
        how = f"{prompts} prompts once"
    else:
        queries = keys = rows * length
        masked = rows * length * length
        how = ""
    layer = layer_activation_bytes(arch, dtype_bytes, queries, keys, masked)
    if ln.gradient_checkpointing:
        kept = arch.layers * queries * arch.hidden * dtype_bytes + layer  # each layer's input; one recomputed
        return ActivationTerm(kept, rows, length, ", ".join(filter(None, (how, "checkpointed"))))
    return ActivationTerm(arch.layers * layer + cache, rows, length, how)
