"""A random Qwen2 with the real 151,936-token vocabulary, shared by the log-prob tests."""

import pytest

from ...conftest import random_qwen2


@pytest.fixture(scope="module")
def qwen2_vocab_model():
    """1 layer, 32 wide, an untied LM head, float32."""
    return random_qwen2()
