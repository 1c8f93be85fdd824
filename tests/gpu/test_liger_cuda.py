"""learner.logprob_kernel: liger on a CUDA device: liger-kernel's compiled kernels give the torch
path's log-probs and gradients (the CPU test runs the same kernels interpreted), and the learner's
choice takes it on a GPU. What it saves: benchmarks/learner_long_tail.py's liger variant.

Run on a GPU machine with `pytest -m gpu`. Skipped without CUDA or without liger-kernel.
"""

import pytest
import torch

from grpo_ray.models.liger_logprobs import chosen_logprob_kernel
from grpo_ray.models.packing import micro_batch_logprobs

from ..conftest import QWEN2_VOCAB, random_qwen2
from .test_packing_cuda import _rows

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _qwen2_vocab_model(dtype):
    """2 layers, 256 wide, a tied LM head."""
    shape = dict(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    return random_qwen2(**shape, tie_word_embeddings=True).to(dtype).cuda()


def test_the_learner_takes_liger_on_a_gpu():
    pytest.importorskip("liger_kernel")
    assert chosen_logprob_kernel("liger", _qwen2_vocab_model(torch.bfloat16), say=True) == "liger"


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("packing", [False, True])
def test_liger_equals_torch_on_the_gpu(dtype, tol, packing):
    pytest.importorskip("liger_kernel")
    torch.backends.cuda.matmul.allow_tf32 = False
    model = _qwen2_vocab_model(dtype)
    ids, mask, completion = (t.cuda() for t in _rows([40, 300, 90, 64, 200, 33], prompt=16, vocab=QWEN2_VOCAB))
    results = {}
    for kernel in ("torch", "liger"):
        logprobs, _ = micro_batch_logprobs(
            model, ids, mask, completion, 0.9, packing=packing, share_prompts=False, chunk_tokens=512, kernel=kernel
        )
        (logprobs * completion).sum().backward()
        results[kernel] = (logprobs * completion, [p.grad.float().clone() for p in model.parameters()])
        model.zero_grad()
    torch.testing.assert_close(results["liger"][0], results["torch"][0], rtol=tol, atol=tol)
    for got, want in zip(results["liger"][1], results["torch"][1]):
        assert (got - want).norm() <= 5 * tol * want.norm() + 1e-6
