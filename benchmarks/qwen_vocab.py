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
        raise SystemExit(
            f"error: {tokenizer_dir} lacks {', '.join(missing)}; pass --qwen-tokenizer DIR with the Qwen2 "
            "tokenizer files"
        )
    config = Qwen2Config(
        vocab_size=QWEN2_VOCAB,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=ENDOFTEXT,
        eos_token_id=ENDOFTEXT,
        pad_token_id=ENDOFTEXT,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).float()
    model.generation_config.do_sample = False
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, folder / name)
    return folder


def probe(
    model_dir: str,
    chunk: int,
    rows: int,
    prompts: int,
    prompt_tokens: int,
    completion_tokens: int,
    repeats: int,
    threads: int,
) -> dict:
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
        # chunk 0 passes no chunk_tokens, so that the probe also runs on code from before it existed.
        chunking = {"chunk_tokens": chunk} if chunk else {}
        logprobs, entropy = completion_logprobs(model, ids, mask, completion, 1.0, with_entropy=True, **chunking)
        ((logprobs * completion).sum() / completion.sum()).backward()
        seconds.append(time.perf_counter() - started)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "chunk_tokens": chunk,
        "rows": rows,
        "tokens_per_row": ids.shape[1],
        "seconds": statistics.median(seconds),
        "peak_rss_mb": peak_mb,
        "rss_before_mb": before_mb,
        "peak_above_loaded_mb": peak_mb - before_mb,
        "threads": threads,
    }


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
    print(
        json.dumps(
            probe(
                args.model,
                args.chunk,
                args.rows,
                args.prompts,
                args.prompt_tokens,
                args.completion_tokens,
                args.repeats,
                args.threads,
            )
        )
    )


if __name__ == "__main__":
    main()


# ---------------------------------------------------------------------------------------------
# The mode of side_by_side.py
# ---------------------------------------------------------------------------------------------

ROWS_PER_STEP = (8, 4)  # prompts x completions
NEW_TOKENS = 32


def _settings(model_dir: Path, steps: int) -> list[str]:
    """grpo-ray on the Qwen-vocabulary model: 8 prompts x 4 completions of 32 tokens, one learner
    (one micro-batch of 32 rows), hf rollout, no KL. A character-length reward, so that groups
    differ and every step updates (on a random model exact match scores every completion 0, and
    every 32-token completion has enough words for length_words' 1)."""
    prompts, samples = ROWS_PER_STEP
    return [
        f"model.path={model_dir}",
        f"train.steps={steps}",
        "train.eval_every=0",
        "data.eval_limit=4",
        "data.max_prompt_tokens=64",
        "weight_sync.probe_every=0",
        f"train.prompts_per_step={prompts}",
        f"rollout.samples_per_prompt={samples}",
        f"rollout.max_new_tokens={NEW_TOKENS}",
        "learner.micro_batch_size=32",
        "reward.functions=[{name: tldr_length, options: {target_chars: 100}}]",
    ]


def _trl_prompts(model_dir: Path, path: Path) -> Path:
    """The tiny task's prompts chat-templated with the Qwen2 tokenizer, as TRL's text rows."""
    from grpo_ray.data.loaders import load_rows
    from grpo_ray.data.prompts import tokenize_prompts
    from grpo_ray.models.loading import load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    prompts = tokenize_prompts(load_rows("tiny:train")[0], tokenizer, 64, True).prompts
    with path.open("w") as f:
        for prompt in prompts:
            f.write(json.dumps({"prompt": tokenizer.decode(prompt.token_ids), "answer": prompt.answer}) + "\n")
    return path


def _probe(sbs, work: Path, model_dir: Path, chunk: int, tree: Path, name: str, reuse: bool) -> dict:
    import sys

    out = work / f"{name}.json"
    command = [sys.executable, str(Path(__file__).resolve()), "probe", "--model", str(model_dir), "--chunk", str(chunk)]
    log = work / f"{name}.log"
    sbs.run(command, log, out, reuse, tree)
    if not out.exists():
        out.write_text(log.read_text().strip().splitlines()[-1])
    return json.loads(out.read_text())


def run_mode(args, sbs) -> None:
    """Before (--before-tree, full logits and generate's sampling) and after, and TRL, on the
    Qwen-vocabulary model; figures to results/side_by_side_qwen_vocab.{json,md}."""
    import os
    import tempfile

    os.environ.setdefault("GRPO_RAY_CACHE", str(sbs.ROOT / ".cache" / "grpo-ray"))
    work = Path(args.reuse) if args.reuse else Path(tempfile.mkdtemp(prefix="grpo-ray-qwen-vocab-"))
    reuse = bool(args.reuse)
    print(f"runs in {work}", flush=True)
    model_dir = build_model(work / "qwen-vocab-model", Path(args.qwen_tokenizer))
    completions = ROWS_PER_STEP[0] * ROWS_PER_STEP[1]
    figures: dict = {
        "model": "random Qwen2, 2 layers x 128, tied embedding, vocab 151,936, Qwen2 tokenizer",
        "rows_per_step": completions,
        "max_new_tokens": NEW_TOKENS,
        "steps": args.steps,
        "warmup": args.warmup,
    }
    trees = {"after": sbs.ROOT}
    if args.before_tree:
        trees["before"] = Path(args.before_tree).resolve()
    for label, tree in trees.items():
        metrics = sbs.grpo_ray(f"qwen-{label}", work, _settings(model_dir, args.steps), reuse, tree)
        figures[label] = sbs.throughput(metrics, args.warmup, completions)
        # The learner's peak: the "after" tree with and without chunking, the "before" tree's full logits.
        chunks = (0, 512) if label == "after" else (0,)
        figures[label]["learner_probe"] = [
            _probe(sbs, work, model_dir, chunk, tree, f"probe-{label}-{chunk}", reuse) for chunk in chunks
        ]
    if sbs.TRL_PYTHON.exists():
        sbs.run(
            [
                str(sbs.TRL_PYTHON),
                str(sbs.HERE / "trl_grpo.py"),
                "--model",
                str(model_dir),
                "--prompts",
                str(_trl_prompts(model_dir, work / "prompts.jsonl")),
                "--steps",
                str(args.steps),
                "--warmup-steps",
                str(args.warmup),
                "--prompts-per-step",
                str(ROWS_PER_STEP[0]),
                "--generations",
                str(ROWS_PER_STEP[1]),
                "--max-new-tokens",
                str(NEW_TOKENS),
                "--micro-batch",
                "32",
                "--output-dir",
                str(work / "trl-out"),
                "--json",
                str(work / "trl.json"),
            ],
            work / "trl.log",
            work / "trl.json",
            reuse,
        )
        figures["trl"] = json.loads((work / "trl.json").read_text())
    results = sbs.HERE / "results"
    (results / "side_by_side_qwen_vocab.json").write_text(json.dumps(figures, indent=2) + "\n")
    (results / "side_by_side_qwen_vocab.md").write_text(_markdown(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    print(_markdown(figures))


def _markdown(f: dict) -> str:
    lines = [
        f"Qwen-vocabulary mode: {f['model']}; {f['rows_per_step']} completions of {f['max_new_tokens']} tokens a step,",
        f"{f['steps']} steps ({f['warmup']} warm-up left out), one learner, hf rollout, no KL.",
        "",
        "| run | samples/s | s/step | rollout s | update s |",
        "|---|---|---|---|---|",
    ]
    for label in ("before", "after"):
        if label in f:
            r = f[label]
            lines.append(
                f"| grpo-ray {label} | {r['samples_per_s']:.2f} | {r['seconds_per_step']:.2f} | "
                f"{r['phases']['rollout']:.2f} | {r['phases']['update']:.2f} |"
            )
    if "trl" in f:
        t = f["trl"]
        lines.append(f"| TRL {t['trl_version']} | {t['samples_per_s']:.2f} | {t['seconds_per_step']:.2f} | | |")
    lines += [
        "",
        "Learner probe: one micro-batch (32 rows x 62 tokens, 8 prompts shared by 4 rows each) log-probs "
        "forward + backward in a process of its own; peak RSS (ru_maxrss) above the RSS once the model and "
        "inputs are loaded.",
        "",
        "| code | chunk_tokens | seconds | peak RSS above loaded, MB |",
        "|---|---|---|---|",
    ]
    for label in ("before", "after"):
        for p in f.get(label, {}).get("learner_probe", []):
            lines.append(f"| {label} | {p['chunk_tokens']} | {p['seconds']:.2f} | {p['peak_above_loaded_mb']:.0f} |")
    return "\n".join(lines) + "\n"
