"""The offline tiny model for agents ("tiny-tools"): the tiny model's architecture, its tokenizer with
single tokens for the JSON scaffolding of a calculator call, pre-trained on three-digit products
solved with the calculator, so that an agent recipe has something to learn from on a laptop.

A three-digit product is out of reach of a 2-layer model in one answer (0% held out); with the
tool it is a matter of copying: call multiply with the two factors, read the result back. The
pre-training shows the tool in a fraction (TOOL_RATE) of its transcripts and a guessed answer in
the rest, so the model starts calling the tool in about a quarter of its samples, and greedily
guesses: GRPO with the calculator environment (examples/agents/calculator.py) then teaches it to
call. The call is the Qwen2.5/Hermes tool format, exactly:

    <tool_call>{"name": "multiply", "arguments": {"a": 123, "b": 456}}</tool_call>

of which `<tool_call>{"name": "multiply", "arguments": {"a": `, `, "b": ` and `}}</tool_call>`
are one token each (added tokens), so a call is 9 tokens and parses with envs/tool_calls.py like
any model's. The weights ship with the package (tiny_tools_v1.safetensors, checked by sha256, as
the tiny model's are: pre-training is numerically chaotic across CPUs); `python -m
grpo_ray.models.tiny_tools --pretrain` rebuilds them.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from grpo_ray.chat_template import reply_tokens
from grpo_ray.models.cache import build_once, default_cache_dir
from grpo_ray.models.tiny import TinyArtifacts, build_tiny_model
from grpo_ray.models.tiny_task import write_jsonl
from grpo_ray.models.tiny_tokenizer import build_tiny_tokenizer, save_tiny_tokenizer
from grpo_ray.models.tiny_weights import load_shipped_weights

VERSION = "tiny-tools-v1"
CALL_OPEN = '<tool_call>{"name": "multiply", "arguments": {"a": '
CALL_MID = ', "b": '
CALL_CLOSE = "}}</tool_call>"
SEED = 0
TOOL_RATE = 0.3  # transcripts that call the calculator; the rest guess
PRETRAIN_STEPS = 1000
PRETRAIN_BATCH_SIZE = 64
PRETRAIN_LR = 1e-3
NUM_TRAIN, NUM_HELDOUT = 4000, 200
SHIPPED = Path(__file__).with_name("tiny_tools_v1.safetensors")
SHIPPED_SHA256 = "8fe6418521bb8ec2e5660187b67fb782282a11649c615ef04e7416cf91c5062a"


def build_tools_tokenizer():
    from tokenizers import AddedToken

    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t in (CALL_OPEN, CALL_MID, CALL_CLOSE, "tool")])
    return tokenizer


def tool_call(a: int, b: int) -> str:
    return f"{CALL_OPEN}{a}{CALL_MID}{b}{CALL_CLOSE}"


def make_product_split(seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """Distinct three-digit products a*b, (train, heldout), rows {"prompt": "123*456=", "answer": "56088"}."""
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    while len(pairs) < NUM_TRAIN + NUM_HELDOUT:
        pair = (rng.randint(100, 999), rng.randint(100, 999))
        if pair not in seen:
            seen.add(pair)
            pairs.append(pair)
    rows = [{"prompt": f"{a}*{b}=", "answer": str(a * b)} for a, b in pairs]
    return rows[NUM_HELDOUT:], rows[:NUM_HELDOUT]


def transcript(tokenizer, row: dict, use_tool: bool, guess: str):
    """(input ids, mask) of one pre-training conversation: the calculator's round trip then the
    result, or a guess; the loss covers the assistant's tokens only, and the tool's reply is the
    chat template's tokens after the call, as in an episode's row (envs/episode.py)."""

    def render(messages, add_generation_prompt):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    end = tokenizer.eos_token_id
    ids = render([{"role": "user", "content": row["prompt"]}], True)
    mask = [0.0] * len(ids)

    def add(tokens: list[int], trained: bool) -> None:
        ids.extend(tokens)
        mask.extend([1.0 if trained else 0.0] * len(tokens))

    if use_tool:
        a, b = (int(x) for x in row["prompt"].rstrip("=").split("*"))
        add(tokenizer.encode(tool_call(a, b), add_special_tokens=False) + [end], trained=True)
        add(reply_tokens(render, end, [{"role": "tool", "content": row["answer"]}]), trained=False)
    add(tokenizer.encode(row["answer"] if use_tool else guess, add_special_tokens=False) + [end], trained=True)
    return np.array(ids, dtype=np.int64), np.array(mask, dtype=np.float32)


def pretrain(model, tokenizer, rows: list[dict], steps: int, seed: int) -> float:
    """Supervised training on the transcripts (assistant tokens only), in place; the last loss."""
    import torch

    rng = random.Random(seed)
    pairs = [transcript(tokenizer, r, rng.random() < TOOL_RATE, str(rng.randint(10000, 999999))) for r in rows]
    width = max(len(ids) for ids, _ in pairs)
    input_ids = torch.full((len(pairs), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    attention = torch.zeros((len(pairs), width), dtype=torch.long)
    for i, (ids, mask) in enumerate(pairs):
        input_ids[i, : len(ids)], attention[i, : len(ids)] = torch.tensor(ids), 1
        labels[i, : len(ids)] = torch.where(torch.tensor(mask) > 0, torch.tensor(ids), -100)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR, weight_decay=0.0)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        index = torch.randint(0, len(pairs), (PRETRAIN_BATCH_SIZE,), generator=generator)
        loss = model(input_ids=input_ids[index], attention_mask=attention[index], labels=labels[index]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    return float(loss.detach())


def ensure_tiny_tools_artifacts(cache_dir: Path | None = None, *, pretrain_here: bool = False) -> TinyArtifacts:
    """The cached tiny-tools model and its data (<cache>/tiny-tools-v1), built once: a few seconds
    with the shipped weights, ~2 minutes pre-training (pretrain_here)."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    name = VERSION + ("-pretrained" if pretrain_here else "")
    final = build_once(cache_dir, name, lambda folder: _build(folder, pretrain_here))
    artifacts = TinyArtifacts(final / "model", final / "train.jsonl", final / "heldout.jsonl")
    return artifacts


def _build(out_dir: Path, pretrain_here: bool) -> None:
    import torch

    started = time.perf_counter()
    train, heldout = make_product_split()
    write_jsonl(train, out_dir / "train.jsonl")
    write_jsonl(heldout, out_dir / "heldout.jsonl")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the shipped weights were made on one thread
    try:
        tokenizer = build_tools_tokenizer()
        model = build_tiny_model(
            len(tokenizer), SEED, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
        )
        loss = pretrain(model, tokenizer, train, PRETRAIN_STEPS, SEED) if pretrain_here else None
        if not pretrain_here:
            load_shipped_weights(model, SHIPPED, SHIPPED_SHA256, "python -m grpo_ray.models.tiny_tools --pretrain")
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(out_dir / "model", safe_serialization=True)
    save_tiny_tokenizer(tokenizer, out_dir / "model")
    info = {
        "version": VERSION,
        "tool_rate": TOOL_RATE,
        "pretrain_steps": PRETRAIN_STEPS,
        "final_train_loss": loss,
        "weights": "pre-trained here" if pretrain_here else SHIPPED.name,
        "build_seconds": round(time.perf_counter() - started, 2),
    }
    (out_dir / "model" / "tiny_info.json").write_text(json.dumps(info, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description="Build (or find) the cached tiny-tools model.")
    parser.add_argument("--pretrain", action="store_true", help="pre-train here (to rebuild the shipped weights)")
    parser.add_argument("--save-weights", type=Path, default=None, help="write the pre-trained weights here")
    args = parser.parse_args()
    art = ensure_tiny_tools_artifacts(pretrain_here=args.pretrain)
    print(f"model_dir: {art.model_dir}")
    if args.save_weights:
        import hashlib

        from safetensors.torch import load_file, save_file

        weights = {
            k: v for k, v in load_file(str(art.model_dir / "model.safetensors")).items() if k != "lm_head.weight"
        }
        save_file(weights, str(args.save_weights))
        print(f"{args.save_weights}: sha256 {hashlib.sha256(args.save_weights.read_bytes()).hexdigest()}")


if __name__ == "__main__":
    main()
