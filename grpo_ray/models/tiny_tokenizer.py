"""The tiny model's tokenizer: one token per character, ChatML special tokens, the role words as
single tokens (grpo_ray/models/tiny.py builds the model around it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ROLE_TOKENS = ("system", "user", "assistant")
# One token per character. The chat template itself only needs "\n"; the rest lets prompts hold
# arithmetic and short lowercase words.
CHARACTERS = "0123456789+-*/=().,?: \n" + "abcdefghijklmnopqrstuvwxyz"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# transformers' Qwen2Tokenizer pre-tokenizer regex, copied so the built tokenizer matches it.
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer with ChatML special tokens, built offline with `tokenizers`.

    Ids: the special tokens first (pad 0, im_start 1, im_end 2), then one id per character of
    CHARACTERS, then the role words as added (non-special) tokens; 55 in all.

    It is a byte-level BPE with no merges and Qwen2's normalizer and pre-tokenizer, because
    transformers 5 loads every ``model_type: qwen2`` checkpoint's tokenizer as Qwen2Tokenizer,
    which rebuilds exactly that pipeline from the saved vocabulary. With no merges every
    character stays one token. Characters outside CHARACTERS are dropped when encoding
    (Qwen2's BPE has no unknown token).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    specials = [PAD_TOKEN, IM_START, IM_END]
    # Byte-level spelling of each character ("\n" is "Ċ", " " is "Ġ").
    symbols = [byte_level.pre_tokenize_str(ch)[0][0] for ch in CHARACTERS]
    vocab = {token: i for i, token in enumerate(specials + symbols)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"), byte_level]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.add_tokens([AddedToken(t, normalized=False) for t in ROLE_TOKENS])
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD_TOKEN, model_max_length=128)
    hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


def save_tiny_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """save_pretrained, naming Qwen2Tokenizer as the class: what AutoTokenizer loads it as."""
    tokenizer.save_pretrained(out_dir)
    config_file = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    config_file.write_text(json.dumps(config, indent=2) + "\n")
