"""The Qwen-vocabulary mode of benchmarks/side_by_side.py: a small random Qwen2 with the real
151,936-token vocabulary and tokenizer, where the LM head and the softmaxes over the vocabulary
are most of a step's work.

    .venv/bin/python benchmarks/side_by_side.py --qwen-vocab [--before-tree DIR]

Also a learner probe, run in a process of its own so that its peak RSS is the learner's:

    .venv/bin/python benchmarks/qwen_vocab.py probe --model DIR --chunk 512
prints {seconds, peak_rss_mb} of one micro-batch's log-probs forward + backward (the learner's
update without the optimizer), median of --repeats.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import time
from pathlib import Path

QWEN2_TOKENIZER = Path("/work/shared/tokenizers/qwen2")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
QWEN2_VOCAB = 151_936
ENDOFTEXT = 151_643  # <|endoftext|>: Qwen2's eos, pad and bos


def build_model(folder: Path, tokenizer_dir: Path = QWEN2_TOKENIZER, hidden: int = 128, layers: int = 2) -> Path:
    """A random tied-embedding Qwen2 (the tiny model's shape, Qwen2's vocabulary: 19.6M
    parameters, 19.4M of them the embedding) saved with the Qwen2 tokenizer. Built once."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if (folder / "config.json").exists():
        return folder
    missing = [name for name in TOKENIZER_FILES if not (tokenizer_dir / name).exists()]
    if missing:
        raise SystemExit(f"error: {tokenizer_dir} lacks {', '.join(missing)}; pass --qwen-tokenizer DIR with the Qwen2 tokenizer files")
    config = Qwen2Config(
        vocab_size=QWEN2_VOCAB, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=ENDOFTEXT, eos_token_id=ENDOFTEXT, pad_token_id=ENDOFTEXT,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).float()
    model.generation_config.do_sample = False
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, folder / name)
    return folder


def probe(model_dir: str, chunk: int, rows: int, prompts: int, prompt_tokens: int, completion_tokens: int,
          repeats: int, threads: int) -> dict:
    """Seconds and peak RSS of the learner's log-probs forward + backward on one micro-batch."""
    import torch

    from grpo_ray.models.loading import load_causal_lm
    from grpo_ray.models.shared_prompts import completion_logprobs

    torch.set_num_threads(threads)
    model = load_causal_lm(model_dir)
    gen = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(0, QWEN2_VOCAB, (prompts, prompt_tokens), generator=gen)
    completions = torch.randint(0, QWEN2_VOCAB, (rows, completion_tokens), generator=gen)
    ids = torch.cat([prompt_ids.repeat_interleave(rows // prompts, dim=0), completions], dim=1)
    mask = torch.ones_like(ids)
    completion = torch.zeros(ids.shape)
    completion[:, prompt_tokens:] = 1
    before_mb = _rss_mb()
    seconds = []
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        logprobs, entropy = completion_logprobs(model, ids, mask, completion, 1.0, with_entropy=True, chunk_tokens=chunk)
        ((logprobs * completion).sum() / completion.sum()).backward()
        seconds.append(time.perf_counter() - started)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"chunk_tokens": chunk, "rows": rows, "tokens_per_row": ids.shape[1], "seconds": statistics.median(seconds),
            "peak_rss_mb": peak_mb, "rss_before_mb": before_mb, "peak_above_loaded_mb": peak_mb - before_mb,
            "threads": threads}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--model", required=True)
    p.add_argument("--chunk", type=int, required=True, help="learner.logprob_chunk_tokens; 0: the full logits")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=30)
    p.add_argument("--completion-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    b = sub.add_parser("build")
    b.add_argument("folder")
    args = parser.parse_args()
    if args.command == "build":
        print(build_model(Path(args.folder)))
        return
    print(json.dumps(probe(args.model, args.chunk, args.rows, args.prompts, args.prompt_tokens, args.completion_tokens,
                           args.repeats, args.threads)))


if __name__ == "__main__":
    main()
