"""Packing on a CUDA device: packed rows give the padded rows' log-probs, entropies and gradients
under the GPU's SDPA kernels (and flash-attention's varlen path where it is installed).

Run on a GPU machine with `pytest -m gpu`. Skipped without CUDA.
"""

import pytest
import torch

from grpo_ray.models.loading import load_causal_lm, sequence_logprobs
from grpo_ray.models.chunked_logprobs import HeadOptions
from grpo_ray.models.packing import packed_completion_logprobs
from grpo_ray.models.tiny import ensure_tiny_artifacts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _rows(lengths, prompt=5, vocab=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), width), generator=gen)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    completion = mask.float()
    completion[:, :prompt] = 0
    return ids * mask, mask, completion


@pytest.mark.parametrize("attention", ["sdpa", "flash_attention_2"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_packed_equals_padded_on_the_gpu(attention, dtype):
    if attention == "flash_attention_2":
        pytest.importorskip("flash_attn")
        if dtype == "float32":
            pytest.skip("flash-attention runs in half precision only")
    torch.backends.cuda.matmul.allow_tf32 = False
    model = load_causal_lm(str(ensure_tiny_artifacts().model_dir), dtype).cuda()
    model.config._attn_implementation = attention
    ids, mask, completion = (t.cuda() for t in _rows([9, 30, 12, 6, 25]))
    padded, padded_entropy = sequence_logprobs(model, ids, mask, 0.8, with_entropy=True, chunk_tokens=16)
    (padded * completion).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    options = HeadOptions(0.8, with_entropy=True, chunk_tokens=16)
    packed, packed_entropy = packed_completion_logprobs(model, ids, mask, completion, options)
    (packed * completion).sum().backward()
    # float32: the CPU test's tolerances; bfloat16: the activations round at ~3 digits either way.
    tol = 1e-5 if dtype == "float32" else 3e-2
    torch.testing.assert_close(packed * completion, padded * completion, rtol=tol, atol=tol)
    torch.testing.assert_close(packed_entropy * completion, padded_entropy * completion, rtol=tol, atol=tol)
    for param, want in zip(model.parameters(), expected):
        assert (param.grad - want).float().norm() <= (1e-4 if dtype == "float32" else 5e-2) * want.float().norm() + 1e-6
