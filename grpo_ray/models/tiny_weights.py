"""The tiny model's shipped pre-trained weights (models/tiny.py's docstring says why they ship):
where they are, their digest, and loading them into a freshly built tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import Qwen2ForCausalLM

SHIPPED_WEIGHTS = Path(__file__).with_name("tiny_v2.safetensors")
SHIPPED_SHA256 = "bfc7a66e5a7ab5fd20ae0d53672661e97ad9fabe9abb7cabeaa4a57de1b795b4"


def load_shipped_weights(
    model: Qwen2ForCausalLM,
    path: Path = SHIPPED_WEIGHTS,
    sha256: str = SHIPPED_SHA256,
    rebuild: str = "python -m grpo_ray.models.tiny --pretrain",
) -> None:
    """A build's shipped pre-trained weights, in place; fails naming the file if it is not the one
    shipped (a truncated or edited copy would silently change every figure)."""
    import hashlib

    from safetensors.torch import load_file

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        raise RuntimeError(
            f"{path}: sha256 {digest[:12]}..., expected {sha256[:12]}...; reinstall grpo-ray or rebuild it ({rebuild})"
        )
    missing, unexpected = model.load_state_dict(load_file(str(path)), strict=False)
    # The LM head is tied to the embeddings, so the file does not hold it.
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"{path}: does not fit the tiny model (missing {missing}, unexpected {unexpected})")
    model.tie_weights()
