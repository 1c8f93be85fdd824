"""What grows with the vocabulary: the [positions, vocab] float32 tensors each role holds while it
turns logits into log-probs or samples from them. With Gemma 3's 262,144-token vocabulary these
dominate a small model: one micro-batch of 64 completions of 16 tokens is 1,024 positions, and one
[1024, 262144] float32 tensor is 1 GiB, where the 270M model's weights are 1 GiB in float32.

Pure arithmetic (config/memory.py's GPU plan and config/host_memory.py's host plan both add these).
Which path runs is models/chunked_logprobs.py's choice, restated here: the LM head a chunk of
learner.logprob_chunk_tokens positions at a time when the model's logits are plain
lm_head(hidden) (models/lm_head.py's PLAIN_HEAD_TYPES), else the full logits of the micro-batch's
completion positions (Gemma's family, a LoRA-wrapped LM head, ZeRO-3's partitioned head, or
logprob_chunk_tokens 0). liger's fused kernel (learner.logprob_kernel: liger) is counted as the
torch chunked path, an upper bound: it bounds its own chunks to about positions x hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_ray.config.architectures import Architecture
from grpo_ray.config.plans import plan_batches, plan_stages
from grpo_ray.config.schema import Config

F32 = 4

# Copies of one [positions, vocab] float32 tensor alive at the peak. Measured 2026-11-28 on the
# 2-core, 23 GiB CPU machine (torch 2.13): peak RSS above the baseline of models/chunked_logprobs'
# two paths on 1,024 positions of a 49,152-token vocabulary, entropies on as the learner asks:
#   full logits, with gradient (the learner): 4.01; 5.01 at temperature 0.7
#   full logits, no gradient (the reference, a teacher): 3.01; 4.01 at temperature 0.7
#   chunked, 512 positions a chunk: 1.57 copies of [1024, vocab], i.e. 3 of [512, vocab]; 1.50 without gradient
# (the logits, logsumexp's exp temporary, the entropy's probabilities, the gradient; dividing by a
# temperature other than 1 makes one more copy).
FULL_WITH_GRAD = 4
FULL_NO_GRAD = 3
CHUNKED = 3
# A decoding step's [rows, vocab] float32 tensors, read from the code (not measured): hf_engine's
# generate keeps the model's logits and its float32 copy, and the recorder (SampledLogprobs with
# models/sampling.py) logsumexp's temporary and the probabilities it draws from; vLLM's sampler the
# logits, their log-softmax for the log-probs it returns and the probabilities it draws from.
HF_SAMPLING = 4
VLLM_SAMPLING = 3

# models/lm_head.py's PLAIN_HEAD_TYPES, the families whose LM head may run a chunk at a time (config
# may not import models/; tests/unit/config/test_vocab_memory.py keeps the two equal).
CHUNKABLE_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral", "gemma3_text"})


@dataclass(frozen=True)
class VocabTerm:
    """`copies` float32 tensors of [positions, vocab] alive at once; `path` says which code path."""

    positions: int
    vocab: int
    copies: int
    path: str

    @property
    def bytes(self) -> float:
        return float(self.positions * self.vocab * F32 * self.copies)


def micro_batch_positions(rows: int, completion_tokens: int, max_tokens_per_micro_batch: int = 0) -> int:
    """LM-head positions of one learner (or reference) micro-batch: its completion columns only (the
    head starts at the first completion column: models/loading.py's sequence_logprobs), rows x the
    longest completion; a token budget (learner.max_tokens_per_micro_batch) caps that, a row longer
    than the budget going alone."""
    positions = rows * completion_tokens
    if max_tokens_per_micro_batch:
        positions = max(min(positions, max_tokens_per_micro_batch), completion_tokens)
    return positions


def scoring_term(
    vocab: int,
    positions: int,
    *,
    chunk_tokens: int,
    chunkable: bool,
    with_grad: bool,
    temperature: float = 1.0,
) -> VocabTerm:
    """The log-prob pass of the learner (with_grad) or of the reference and a teacher (without):
    3 copies of a [chunk, vocab] chunk when the head may be chunked, else the whole micro-batch's
    logits, one copy more when the temperature divides them."""
    if chunkable and chunk_tokens > 0:
        chunk = min(chunk_tokens, positions)
        return VocabTerm(chunk, vocab, CHUNKED, f"chunks of {chunk_tokens}")
    copies = (FULL_WITH_GRAD if with_grad else FULL_NO_GRAD) + (temperature != 1.0)
    return VocabTerm(positions, vocab, copies, "full logits")


def sampling_term(vocab: int, rows: int, backend: str, max_num_seqs: int | None = None) -> VocabTerm:
    """A decoding step of the rollout engine: every row it generates at once (hf: the worker's whole
    share; vLLM: at most its max_num_seqs)."""
    if backend == "vllm":
        rows = min(rows, max_num_seqs) if max_num_seqs else rows
        return VocabTerm(rows, vocab, VLLM_SAMPLING, "vLLM's sampler")
    return VocabTerm(rows, vocab, HF_SAMPLING, "generate's step")


def head_is_chunkable(model_type: str, lora_on_head: bool = False, zero3: bool = False) -> bool:
    """Whether models/lm_head.plain_lm_head would hand the head to the chunked path."""
    return model_type in CHUNKABLE_TYPES and not lora_on_head and not zero3


def scoring_vocab(cfg: Config, arch: Architecture, with_grad: bool) -> VocabTerm:
    """The recipe's log-prob pass of `arch`: the learner's (with_grad), or the reference's and a
    teacher's, which take the learner's micro-batches and chunking (cluster/settings.py)."""
    ln, lora, stages = cfg.learner, cfg.model.lora, plan_stages(cfg)
    completion = max(stage.max_new_tokens for stage in stages)
    positions = micro_batch_positions(plan_batches(cfg).micro_batch_size, completion, ln.max_tokens_per_micro_batch)
    chunkable = head_is_chunkable(
        arch.model_type,
        lora_on_head=with_grad and lora.enabled and "lm_head" in lora.target_modules,
        zero3=with_grad and ln.zero_stage == 3,
    )
    return scoring_term(
        arch.vocab,
        positions,
        chunk_tokens=ln.logprob_chunk_tokens,
        chunkable=chunkable,
        with_grad=with_grad,
        temperature=max(stage.temperature for stage in stages),
    )


def sampling_vocab(cfg: Config, arch: Architecture) -> VocabTerm:
    """A rollout worker's decoding step over the rows of its share (prompts x samples_per_prompt)."""
    r = cfg.rollout
    rows = plan_batches(cfg).prompts_per_rollout_worker * r.samples_per_prompt
    return sampling_term(arch.vocab, rows, r.backend, r.vllm.engine_args.get("max_num_seqs"))
