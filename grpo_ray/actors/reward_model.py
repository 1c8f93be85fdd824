"""RewardModelWorker: scalar scores from a sequence-classification reward model (one per row).

Example (the offline tiny reward model; a real one is any Hugging Face folder or hub id whose
``AutoModelForSequenceClassification`` has ``num_labels == 1``)::

    path = build_tiny_reward_model(Path("/tmp/tiny-rm"))
    worker = RewardModelWorker(str(path), batch_size=32)
    worker.score(rollout_slice)          # -> np.ndarray [N] float64, one logit per row

Each row is scored as the chat ``user: prompt / assistant: completion`` rendered by the
tokenizer's chat template (prompt + completion when it has none), so the model sees what it was
trained on. Rows are truncated to ``max_length`` tokens, keeping the start (the usual
right-side truncation: a completion that does not fit is scored on its beginning).

Padding. Batches are right-padded with an attention mask. Hugging Face's classification heads
pool the rightmost token that is not ``config.pad_token_id``, so that id must (a) be the id
padded with and (b) never be a row's real last token. The tokenizer's pad id, which defaults to
eos, breaks (b) whenever a chat template ends a turn with eos (Llama 3's ``<|eot_id|>``): the
score would be read one token early. Each batch is therefore padded with the tokenizer's pad id
unless some row ends with it, and then with an id that ends no row; ``config.pad_token_id`` is
set to match before the forward. Pad positions come after every real token, so under causal
attention their ids change nothing else. Rows are scored longest first, so a batch pads little.

A plain class, as every actor here: the cluster layer applies ``ray.remote``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from grpo_ray.errors import first_line
from grpo_ray.models.loading import ModelLoadError, load_tokenizer, resolve_model_path
from grpo_ray.types import RolloutSlice

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class RewardModelWorker:
    def __init__(
        self,
        model_path: str,
        tokenizer_path: str | None = None,
        dtype: str = "float32",
        batch_size: int = 32,
        torch_threads: int = 1,
        max_length: int = 1024,
    ):
        if batch_size < 1 or max_length < 1:
            raise ValueError(f"reward model: batch_size={batch_size}, max_length={max_length}; both must be >= 1")
        torch.set_num_threads(torch_threads)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = _load_reward_model(model_path, dtype).to(self.device).eval()
        self.tokenizer = load_tokenizer(tokenizer_path or model_path)  # pad defaults to eos
        _set_pad_token_id(self.model, self.tokenizer.pad_token_id)
        self.batch_size = batch_size
        self.max_length = max_length

    def ready(self) -> str:
        return "reward_model"

    @torch.no_grad()
    def score(self, batch: RolloutSlice) -> np.ndarray:
        """[N] float64: the model's scalar logit for each row's (prompt, completion)."""
        rows = reward_model_inputs(self.tokenizer, batch.prompts, batch.completions, self.max_length)
        scores = np.zeros(len(rows), dtype=np.float64)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))  # longest first: little padding
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            scores[chunk] = self._score_padded([rows[i] for i in chunk])
        return scores

    def _score_padded(self, rows: list[list[int]]) -> np.ndarray:
        pad_id = padding_id(rows, self.tokenizer.pad_token_id)
        width = max(len(row) for row in rows)
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            attention_mask[i, : len(row)] = 1
        # The head pools the rightmost token that is not config.pad_token_id: see the module doc.
        _set_pad_token_id(self.model, pad_id)
        logits = self.model(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device)
        ).logits  # [B, 1]
        return logits[:, 0].double().cpu().numpy()


def reward_model_inputs(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], completions: list[str], max_length: int
) -> list[list[int]]:
    """Token ids of each (prompt, completion) as a user/assistant chat, at most max_length long.

    With a chat template, its text is encoded without adding special tokens (the template has
    them); without one, prompt + completion is encoded as plain text, special tokens added.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
    if not prompts:
        return []
    if getattr(tokenizer, "chat_template", None):
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}],
                tokenize=False,
            )
            for prompt, completion in zip(prompts, completions)
        ]
        add_special_tokens = False
    else:
        texts = [prompt + completion for prompt, completion in zip(prompts, completions)]
        add_special_tokens = True
    encoded = tokenizer(texts, add_special_tokens=add_special_tokens, truncation=True, max_length=max_length)
    return [list(ids) for ids in encoded["input_ids"]]


def padding_id(rows: list[list[int]], preferred: int) -> int:
    """``preferred`` unless some row ends with it; then the smallest id that ends no row."""
    last_tokens = {row[-1] for row in rows if row}
    if preferred not in last_tokens:
        return preferred
    return min(set(range(len(last_tokens) + 1)) - last_tokens)


def _set_pad_token_id(model: torch.nn.Module, pad_id: int) -> None:
    model.config.pad_token_id = pad_id
    model.config.get_text_config().pad_token_id = pad_id  # what the head reads (multimodal: differs)


def _load_reward_model(path: str, dtype: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForSequenceClassification

    resolved = resolve_model_path(path)
    try:
        config = AutoConfig.from_pretrained(resolved)
        # Checked before the weights load: a causal LM checkpoint has no head and reads as 2.
        if config.num_labels != 1:
            raise ModelLoadError(
                f"reward model {path}: has num_labels={config.num_labels}, a reward model needs one "
                "scalar output; give a sequence-classification checkpoint saved with num_labels=1 "
                "(a plain causal LM has no reward head)"
            )
        return AutoModelForSequenceClassification.from_pretrained(resolved, dtype=getattr(torch, dtype))
    except ModelLoadError:
        raise
    except (OSError, ValueError, AttributeError) as err:
        raise ModelLoadError(f"reward model {path}: cannot load ({first_line(err)}); check the path") from None


def build_tiny_reward_model(out_dir: Path, seed: int = 0) -> Path:
    """Save a randomly initialised tiny Qwen2ForSequenceClassification (num_labels=1) and the
    tiny tokenizer into ``out_dir``; returns ``out_dir``. Offline, about a second.

    Same shape as the tiny policy (:func:`grpo_ray.models.tiny.build_tiny_model`), so the tiny
    recipe can run a reward model next to it. Its scores mean nothing: it is for plumbing.
    """
    from transformers import Qwen2ForSequenceClassification

    from grpo_ray.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_tokenizer

    out_dir = Path(out_dir)
    tokenizer = build_tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG as it was
        config = build_tiny_model(
            len(tokenizer), seed, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
        ).config
        config.num_labels = 1
        config.tie_word_embeddings = False  # no LM head to tie
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    save_tiny_tokenizer(tokenizer, out_dir)
    return out_dir
