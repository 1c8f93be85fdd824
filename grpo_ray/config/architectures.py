"""The shapes of decoder models, for the memory plan (config/memory.py): read from a model folder's
config.json, or from a table of the hub ids and built-in models a recipe may name without one.

Where the table's figures come from: each entry is the model's config.json fields as published on
the Hugging Face hub (Qwen2.5, Qwen3-4B, DeepSeek-R1-Distill-Qwen-7B, SmolLM2-135M-Instruct, Gemma
3 270M), written out here because a recipe that names a hub id is planned offline; the built-in
tiny models' from models/tiny.py (a test builds one and compares). tests/unit/config/test_memory.py
checks each count against the published size and, for the Qwen3 and Gemma 3 shapes, against
transformers' own model built on the meta device."""

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
# Qwen3-4B (hub config.json): no q/k/v bias, a q_norm and a k_norm of head_dim per layer, and an
# explicit head_dim (2560 / 32 = 80, but 128 here).
_QWEN3_4B = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "tie_word_embeddings": True,
}
# Gemma 3 270M (google/gemma-3-270m's config.json; the -it model has the same shape): head_dim 256
# where 640 / 4 would give 160, four norms per layer (before and after attention and MLP) and q/k
# norms, and 5 of every 6 layers attend to the last 512 tokens only.
_GEMMA3_270M = {
    "model_type": "gemma3_text",
    "vocab_size": 262144,
    "hidden_size": 640,
    "intermediate_size": 2048,
    "num_hidden_layers": 18,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "tie_word_embeddings": True,
    "sliding_window": 512,
    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
}
_QWEN_7B = {
    **_QWEN,
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
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
    "qwen2.5-7b": _QWEN_7B,
    # configs/polaris-7b.yaml's deepseek-ai/DeepSeek-R1-Distill-Qwen-7B: Qwen2.5-Math-7B's shape, which
    # is Qwen2.5-7B's (untied, vocabulary 152064).
    "deepseek-r1-distill-qwen-7b": _QWEN_7B,
    "qwen3-4b": _QWEN3_4B,  # configs/polaris.yaml
    "qwen3-4b-base": _QWEN3_4B,
    # The built-in (models/, from the gemma3-270m GGUF packages) and the hub's ids.
    "gemma3-270m": _GEMMA3_270M,
    "gemma-3-270m": _GEMMA3_270M,
    "gemma-3-270m-it": _GEMMA3_270M,
}
# Families with two more norms per layer (after attention and after the MLP: "sandwich" norms).
_SANDWICH_NORMS = frozenset({"gemma2", "gemma3", "gemma3_text"})
# Families with an RMSNorm of head_dim on the queries and one on the keys in every layer.
_QK_NORMS = frozenset({"qwen3", "gemma3", "gemma3_text"})


@dataclass(frozen=True)
class Architecture:
    """A Qwen2/Qwen3/Llama/Gemma-style decoder: q/k/v/o attention (bias on q/k/v when qkv_bias) of
    `heads` heads of `head_dim` (not always hidden / heads: Gemma 3 and Qwen3 set it), a SwiGLU MLP,
    `norms_per_layer` RMSNorms of `hidden` per layer and, with qk_norm, one of head_dim on q and on k."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool
    qkv_bias: bool
    head_dim: int
    model_type: str = "llama"
    norms_per_layer: int = 2
    qk_norm: bool = False
    # Layers that attend to the last `sliding_window` tokens only (Gemma 3: 15 of 18): their KV
    # cache stops growing there.
    sliding_layers: int = 0
    sliding_window: int = 0

    @staticmethod
    def from_config(config: dict) -> Architecture:
        heads = int(config["num_attention_heads"])
        model_type = str(config.get("model_type", "llama"))
        window = int(config.get("sliding_window") or 0)
        sliding = sum(kind == "sliding_attention" for kind in config.get("layer_types") or ()) if window else 0
        return Architecture(
            vocab=int(config["vocab_size"]),
            hidden=int(config["hidden_size"]),
            intermediate=int(config["intermediate_size"]),
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            tied=bool(config.get("tie_word_embeddings")),
            qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias")),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            model_type=model_type,
            norms_per_layer=4 if model_type in _SANDWICH_NORMS else 2,
            qk_norm=model_type in _QK_NORMS,
            sliding_layers=sliding,
            sliding_window=window if sliding else 0,
        )

    def matrix_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one decoder layer, by module name."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, self.intermediate),
            "up_proj": (h, self.intermediate),
            "down_proj": (self.intermediate, h),
        }

    @property
    def parameters(self) -> int:
        shapes = self.matrix_shapes()
        bias = sum(shapes[name][1] for name in ("q_proj", "k_proj", "v_proj")) if self.qkv_bias else 0
        norms = self.norms_per_layer * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        per_layer = sum(i * o for i, o in shapes.values()) + bias + norms
        return self.embedding_parameters + self.layers * per_layer + self.hidden  # final norm

    @property
    def embedding_parameters(self) -> int:
        """The token embedding, and the LM head when it is not tied to it."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def lora_parameters(self, rank: int, target_modules: tuple[str, ...]) -> int:
        """r x (in + out) per adapted matrix; a target is a module-name suffix, as peft matches."""
        shapes = self.matrix_shapes()
        return self.layers * sum(rank * (i + o) for name, (i, o) in shapes.items() if name in target_modules)

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        """K and V of one token in every layer: the most a token costs (vLLM's GPU token count)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def kv_bytes(self, tokens: int, dtype_bytes: float) -> float:
        """K and V of one sequence of `tokens`, a sliding-window layer keeping its window at most."""
        full = self.layers - self.sliding_layers
        kept = full * tokens + self.sliding_layers * min(tokens, self.sliding_window)
        return 2 * kept * self.kv_heads * self.head_dim * dtype_bytes


def find_architecture(path: str) -> Architecture | None:
    """From `path`/config.json when it is a local folder, else `ARCHITECTURES` by hub id; None if unknown."""
    config_file = Path(path).expanduser() / "config.json"
    if config_file.is_file():
        return Architecture.from_config(json.loads(config_file.read_text()))
    name = path.rsplit("/", 1)[-1].lower().removesuffix("-instruct")
    return Architecture.from_config(ARCHITECTURES[name]) if name in ARCHITECTURES else None
