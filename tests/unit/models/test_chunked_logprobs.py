"""Chunked LM-head log-probs: the full-logits path's log-probs, entropies and gradients, without
its [tokens, vocab] logits."""

import pytest
import torch

from grpo_ray.algo import entropy_from_logits, token_logprobs_from_logits
from grpo_ray.models.chunked_logprobs import chunked_token_stats
from grpo_ray.models.lm_head import plain_lm_head
from grpo_ray.models.loading import load_causal_lm, sequence_logprobs
from grpo_ray.models.shared_prompts import completion_logprobs
from grpo_ray.models.tiny import ensure_tiny_artifacts

from ...conftest import QWEN2_VOCAB


def _head_inputs(dtype, tokens=7, width=4, vocab=11, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, width, generator=gen, dtype=dtype, requires_grad=True)
    weight = torch.randn(vocab, width, generator=gen, dtype=dtype, requires_grad=True)
    bias = torch.randn(vocab, generator=gen, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    return hidden, weight, bias, targets


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gradients_are_the_analytic_ones(temperature):
    # float64 central differences against the hand-written backward, log-probs and entropies each
    # alone and together (the backward has one branch per combination), chunks of 3 over 7 tokens.
    hidden, weight, bias, targets = _head_inputs(torch.float64)
    for pick in (lambda out: out[0], lambda out: out[1], lambda out: out[0] * 0.3 + out[1]):
        assert torch.autograd.gradcheck(
            lambda h, w, b: pick(chunked_token_stats(h, w, b, targets, temperature, 3, True)), (hidden, weight, bias)
        )


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_same_values_and_gradients_as_the_full_logits(chunk):
    hidden, weight, bias, targets = _head_inputs(torch.float32, tokens=9, width=8, vocab=50)
    logits = torch.nn.functional.linear(hidden, weight, bias)
    full_lp = token_logprobs_from_logits(logits, targets, 0.8)
    full_ent = entropy_from_logits(logits, 0.8)
    coef = torch.linspace(-1, 1, 9)
    (full_lp * coef + full_ent * 0.1).sum().backward()
    expected = [t.grad.clone() for t in (hidden, weight, bias)]
    for t in (hidden, weight, bias):
        t.grad = None

    lp, ent = chunked_token_stats(hidden, weight, bias, targets, 0.8, chunk, True)
    torch.testing.assert_close(lp, full_lp)
    torch.testing.assert_close(ent, full_ent)
    (lp * coef + ent * 0.1).sum().backward()
    for t, grad in zip((hidden, weight, bias), expected):
        torch.testing.assert_close(t.grad, grad)


def test_bfloat16_weights_agree_with_the_full_path_to_bfloat16_rounding():
    # Both paths compute logits in bfloat16 then float32; gradients round to bfloat16 once.
    hidden, weight, _, targets = _head_inputs(torch.bfloat16, tokens=16, width=32, vocab=300)
    full_lp = token_logprobs_from_logits(torch.nn.functional.linear(hidden, weight).float(), targets)
    full_lp.sum().backward()
    expected = [hidden.grad.clone(), weight.grad.clone()]
    hidden.grad = weight.grad = None
    lp, ent = chunked_token_stats(hidden, weight, None, targets, 1.0, 5, False)
    assert ent is None and lp.dtype == torch.float32
    torch.testing.assert_close(lp, full_lp)
    lp.sum().backward()
    for got, want in zip((hidden.grad, weight.grad), expected):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_bad_temperature_and_chunk_are_refused():
    hidden, weight, bias, targets = _head_inputs(torch.float32)
    with pytest.raises(ValueError, match="temperature"):
        chunked_token_stats(hidden, weight, bias, targets, 0.0, 4, False)
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_token_stats(hidden, weight, bias, targets, 1.0, 0, False)


def _rows():
    """Right-padded rows: two share a prompt (the shared-prompt pass runs), one is shorter."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, 7, 11, 12, 0], [13, 14, 15, 16, 17, 18]])
    completion = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.float32)
    return ids, (ids != 0).long(), completion


def _lm_head_positions(model):
    seen = []
    model.get_output_embeddings().register_forward_hook(lambda module, args, out: seen.append(out.shape[1]))
    return seen


def _compare_paths(model, run, entropy_grad=True):
    """Log-probs, entropies and every parameter's gradient of run(chunk_tokens) with 0 and 4."""
    results = []
    for chunk in (0, 4):
        model.zero_grad()
        lp, ent = run(chunk)
        (lp.sum() + (ent.sum() * 0.5 if entropy_grad else 0)).backward()
        results.append((lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]))
    (lp0, ent0, grads0), (lp1, ent1, grads1) = results
    torch.testing.assert_close(lp1, lp0)
    torch.testing.assert_close(ent1, ent0)
    for got, want in zip(grads1, grads0):
        assert (got - want).norm() <= 1e-5 * want.norm() + 1e-12


def test_tiny_model_tied_head_sequence_and_shared_prompt_paths_agree():
    model = load_causal_lm(str(ensure_tiny_artifacts().model_dir))
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    ids, mask, completion = _rows()
    seen = _lm_head_positions(model)
    _compare_paths(
        model,
        lambda chunk: sequence_logprobs(
            model, ids, mask, 0.7, with_entropy=True, entropy_grad=True, from_column=2, chunk_tokens=chunk
        ),
    )
    # The full path keeps T - from_column + 1 = 5 positions; the chunked one asks the head for 1.
    assert seen == [5, 1]
    _compare_paths(
        model,
        lambda chunk: completion_logprobs(
            model, ids, mask, completion, 0.7, with_entropy=True, entropy_grad=True, chunk_tokens=chunk
        ),
    )


def test_entropy_is_a_metric_unless_asked_on_the_chunked_path():
    model = load_causal_lm(str(ensure_tiny_artifacts().model_dir))
    ids, mask, _ = _rows()
    lp, metric = sequence_logprobs(model, ids, mask, with_entropy=True, chunk_tokens=4)
    assert lp.requires_grad and not metric.requires_grad
    with torch.no_grad():
        lp, metric = sequence_logprobs(model, ids, mask, with_entropy=True, entropy_grad=True, chunk_tokens=4)
    assert not lp.requires_grad and not metric.requires_grad


def test_qwen2_vocabulary_model_agrees(qwen2_vocab_model):
    model = qwen2_vocab_model
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, QWEN2_VOCAB, (3, 12), generator=gen)
    ids[1, 3:] = ids[0, 3:]  # rows 0 and 1 share a 3-token prompt
    mask = torch.ones_like(ids)
    mask[2, 10:] = 0
    completion = torch.zeros(ids.shape)
    completion[:, 3:] = 1
    completion *= mask
    _compare_paths(
        model,
        lambda chunk: completion_logprobs(
            model, ids, mask, completion, 0.9, with_entropy=True, entropy_grad=True, chunk_tokens=chunk
        ),
    )


def random_gemma3(**overrides):
    """A 2-layer Gemma 3 (one sliding-window layer of 4 tokens, one full), tied head, float32."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=300,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        **overrides,
    )
    return Gemma3ForCausalLM(config).float()


def test_a_gemma3_model_sliding_window_included_agrees_and_a_soft_capped_one_is_refused():
    model = random_gemma3()
    assert plain_lm_head(model) is model.lm_head
    ids, mask, completion = _rows()
    _compare_paths(
        model,
        lambda chunk: completion_logprobs(
            model, ids, mask, completion, 0.9, with_entropy=True, entropy_grad=True, chunk_tokens=chunk
        ),
    )
    # Gemma 2's way, tanh(logits / cap) * cap: not lm_head(hidden) alone.
    assert plain_lm_head(random_gemma3(final_logit_softcapping=30.0)) is None


def test_heads_other_than_a_plain_linear_take_the_full_path(qwen2_vocab_model):
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    assert plain_lm_head(load_causal_lm(str(ensure_tiny_artifacts().model_dir))) is not None
    # Architectures not known to be lm_head(hidden) and nothing else (Gemma soft-caps, ...).
    assert plain_lm_head(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20))) is None
    # LoRA on the LM head: the adapter's delta would be missing from weight @ hidden.
    tiny = load_causal_lm(str(ensure_tiny_artifacts().model_dir))
    lora = get_peft_model(tiny, LoraConfig(r=2, target_modules=["lm_head", "q_proj"], task_type="CAUSAL_LM"))
    assert plain_lm_head(lora) is None
    ids, mask, _ = _rows()
    torch.testing.assert_close(
        sequence_logprobs(lora, ids, mask, chunk_tokens=4)[0], sequence_logprobs(lora, ids, mask)[0]
    )
    # LoRA elsewhere keeps the plain head, and the adapter's layers run inside the decoder.
    lora_attention = get_peft_model(
        load_causal_lm(str(ensure_tiny_artifacts().model_dir)),
        LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"),
    )
    assert plain_lm_head(lora_attention) is not None
    _compare_paths(
        lora_attention,
        lambda chunk: sequence_logprobs(lora_attention, ids, mask, with_entropy=True, chunk_tokens=chunk),
        entropy_grad=False,
    )
