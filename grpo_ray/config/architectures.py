"""The shapes of decoder models, for the memory plan (config/memory.py): read from a model folder's
config.json, or from a table of the hub ids and built-in models a recipe may name without one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# config.json fields of the Qwen2.5 family and the built-in models, for hub ids and built-in names.
_QWEN = {"model_type": "qwen2", "vocab_size": 151936, "tie_word_embeddings": True}
_QWEN_HALF_B = {
    **_QWEN,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
}
# The built-in tiny models (models/tiny.py's build_tiny_model): one shape, their vocabularies apart.
_TINY = {
    "model_type": "qwen2",
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}
ARCHITECTURES: dict[str, dict] = {
    "tiny": {**_TINY, "vocab_size": 55},
    "tiny-tools": {**_TINY, "vocab_size": 59},
    "tiny-teacher": {**_TINY, "vocab_size": 55},  # the tiny model after GRPO (models/tiny_teacher.py)
    # The built-in real model (models/smollm2.py), and the hub's HuggingFaceTB/SmolLM2-135M-Instruct.
    "smollm2-135m": {
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "tie_word_embeddings": True,
    },
    "qwen2.5-0.5b": _QWEN_HALF_B,
    # Qwen2-0.5B has the same shape as Qwen2.5-0.5B.
    "qwen2-0.5b": _QWEN_HALF_B,
    "qwen2.5-1.5b": {
        **_QWEN,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
    },
    "qwen2.5-3b": {
        **_QWEN,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
    },
    "qwen2.5-7b": {
        **_QWEN,
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
    },
}


@dataclass(frozen=True)
class Architecture:
    """A Qwen2/Llama-style decoder: q/k/v/o attention (bias on q/k/v when qkv_bias) and a SwiGLU MLP."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool
    qkv_bias: bool

    @staticmethod
    def from_config(config: dict) -> Architecture:
        heads = int(config["num_attention_heads"])
        return Architecture(
            vocab=int(config["vocab_size"]),
            hidden=int(config["hidden_size"]),
            intermediate=int(config["intermediate_size"]),
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            tied=bool(config.get("tie_word_embeddings")),
            qkv_bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias")),
        )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def matrix_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one decoder layer, by module name."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        return {
            "q_proj": (h, h),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (h, h),
            "gate_proj": (h, self.intermediate),
            "up_proj": (h, self.intermediate),
            "down_proj": (self.intermediate, h),
        }

    @property
    def parameters(self) -> int:
        shapes = self.matrix_shapes()
        bias = sum(shapes[name][1] for name in ("q_proj", "k_proj", "v_proj")) if self.qkv_bias else 0
        per_layer = sum(i * o for i, o in shapes.values()) + bias + 2 * self.hidden  # two RMSNorms
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * per_layer + self.hidden  # final norm

    def lora_parameters(self, rank: int, target_modules: tuple[str, ...]) -> int:
        """r x (in + out) per adapted matrix; a target is a module-name suffix, as peft matches."""
        shapes = self.matrix_shapes()
        return self.layers * sum(rank * (i + o) for name, (i, o) in shapes.items() if name in target_modules)

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def find_architecture(path: str) -> Architecture | None:
    """From `path`/config.json when it is a local folder, else `ARCHITECTURES` by hub id; None if unknown."""
    config_file = Path(path).expanduser() / "config.json"
    if config_file.is_file():
        return Architecture.from_config(json.loads(config_file.read_text()))
    name = path.rsplit("/", 1)[-1].lower().removesuffix("-instruct")
    return Architecture.from_config(ARCHITECTURES[name]) if name in ARCHITECTURES else None
