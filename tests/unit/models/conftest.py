"""A random Qwen2 with the real 151,936-token vocabulary, shared by the log-prob tests."""

import pytest
import torch

QWEN2_VOCAB = 151_936


@pytest.fixture(scope="module")
def qwen2_vocab_model():
    """1 layer, 32 wide, an untied LM head, float32."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=QWEN2_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(config).float()
