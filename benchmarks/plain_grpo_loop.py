"""A plain single-process GRPO loop on the tiny task: no Ray, no DeepSpeed, no weight sync.

The yardstick the platform must not lose to (issue: time to accuracy), and the quickest way to
tell a learning problem from an orchestration problem. Same model, data, reward and loss
functions as `grpo-ray train configs/tiny.yaml`.

    python benchmarks/plain_grpo_loop.py --steps 200 --eval-every 50
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from grpo_ray.actors.hf_engine import HFEngine  # noqa: E402
from grpo_ray.actors.slices import pack_slice  # noqa: E402
from grpo_ray.algo import compute_advantages, grpo_loss  # noqa: E402
from grpo_ray.data.loaders import load_rows  # noqa: E402
from grpo_ray.data.prompts import PromptStream, tokenize_prompts  # noqa: E402
from grpo_ray.models.loading import load_tokenizer, resolve_model_path  # noqa: E402
from grpo_ray.models.shared_prompts import completion_logprobs  # noqa: E402
from grpo_ray.rewards import exact_match  # noqa: E402
from grpo_ray.types import SamplingSettings  # noqa: E402


def accuracy(engine: HFEngine, prompts, max_new_tokens: int) -> float:
    greedy = SamplingSettings(samples_per_prompt=1, max_new_tokens=max_new_tokens, temperature=0.0)
    groups = engine.generate([p.token_ids for p in prompts], greedy)
    scores = exact_match([g[0].text for g in groups], [p.text for p in prompts], [p.answer for p in prompts])
    return float(np.mean(scores))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-new-tokens", type=int, default=5)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--target", type=float, default=None, help="stop when held-out accuracy reaches this")
    parser.add_argument("--json", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: every core)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    tokenizer = load_tokenizer("tiny")
    engine = HFEngine(resolve_model_path("tiny"), tokenizer)
    model = engine.model  # the loop trains the very model it samples from: no sync needed
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    train = tokenize_prompts(load_rows("tiny:train")[0], tokenizer, 32, True).prompts
    heldout = tokenize_prompts(load_rows("tiny:heldout")[0], tokenizer, 32, True).prompts
    stream = PromptStream(train, seed=args.seed)

    curve = [(0, 0.0, accuracy(engine, heldout, args.max_new_tokens))]
    started = time.perf_counter()  # seconds count from the end of the step-0 evaluation
    print(f"step 0 acc {curve[0][2]:.3f}", flush=True)
    for step in range(1, args.steps + 1):
        prompts = stream.take(args.prompts)
        sampling = SamplingSettings(args.samples, args.max_new_tokens, 1.0, seed=args.seed * 1_000_003 + step)
        model.eval()
        groups = engine.generate([p.token_ids for p in prompts], sampling)
        rows = [(k, p, c) for k, (p, g) in enumerate(zip(prompts, groups)) for c in g]
        batch = pack_slice(rows, tokenizer.pad_token_id, step)
        rewards = torch.tensor(exact_match(batch.completions, batch.prompts, batch.answers), dtype=torch.float32)
        advantages = compute_advantages("grpo", rewards, torch.from_numpy(batch.group_ids))
        model.train()
        # The learner's log-prob function (each distinct prompt run once): the loop differs from
        # grpo-ray in orchestration only.
        logprobs, _ = completion_logprobs(
            model,
            torch.from_numpy(batch.input_ids),
            torch.from_numpy(batch.attention_mask),
            torch.from_numpy(batch.completion_mask),
        )
        out = grpo_loss(
            logprobs=logprobs,
            old_logprobs=logprobs.detach(),
            advantages=advantages,
            mask=torch.from_numpy(batch.completion_mask),
            clip_low=0.2,
            clip_high=0.2,
        )
        optimizer.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % args.eval_every == 0 or step == args.steps:
            acc = accuracy(engine, heldout, args.max_new_tokens)
            curve.append((step, time.perf_counter() - started, acc))
            print(f"step {step} reward {rewards.mean():.3f} acc {acc:.3f} at {curve[-1][1]:.0f}s", flush=True)
            if args.target is not None and acc >= args.target:
                break
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"curve": curve, "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
