"""The learner's activations (config/activation_memory.py): one layer worked by hand, the same
arithmetic against the bytes autograd really saves in small Llama and Gemma 3 models through each of
the learner's forwards, and the recipes' micro-batches worked by hand."""

from pathlib import Path

import pytest

from grpo_ray.config import load_config
from grpo_ray.config.activation_memory import layer_activation_bytes, learner_activations
from grpo_ray.config.architectures import Architecture, find_architecture

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
SMOLLM2 = find_architecture("smollm2-135m")
GEMMA = find_architecture("gemma3-270m")

# Small shapes: a Llama with 4 query heads over 2 kv heads (keys and values copied for the kernel)
# and a Gemma 3 with one kv head (repeated as a view), q/k norms and four norms a layer.
LLAMA_FIELDS = {
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}
GEMMA_FIELDS = {
    **LLAMA_FIELDS,
    "model_type": "gemma3_text",
    "num_key_value_heads": 1,
    "head_dim": 32,
    "sliding_window": 4,
}
LLAMA = Architecture.from_config({**LLAMA_FIELDS, "num_hidden_layers": 1})


def test_one_llama_layer_by_hand():
    # hidden 64, 4 heads x 16 (q 64, kv 2 x 16 = 32), intermediate 160, float32. Per query position:
    #   2 norms of 64: input (float32) + normalised = 128 x (4 + 4) = 1,024, 1 / rms 2 x 4 = 8
    #   q/k/v's and gate/up's inputs 2 x 64 x 4 = 512; rotated q + attention output 2 x 64 x 4 = 512;
    #   logsumexp 4 heads x 4 = 16; MLP 4 x 160 x 4 = 2,560                      = 4,632 B
    # per key: k and v copied to 4 heads, 2 x 64 x 4 = 512 B; per masked pair 4 B.
    # 8 rows of 12 tokens: 96 x (4,632 + 512) + 8 x 12 x 12 x 4 = 493,824 + 4,608 = 498,432 B.
    assert layer_activation_bytes(LLAMA, 4, 96, 96, 8 * 12 * 12) == 498_432
    # In bfloat16 the norms keep their input in float32: 128 x (4 + 2) + 8 + (512 + 512 + 2,560) / 2
    # + 16 = 2,584 per query, 256 per key, 2 per pair: 96 x 2,840 + 1,152 x 2 = 274,944 B.
    assert layer_activation_bytes(LLAMA, 2, 96, 96, 8 * 12 * 12) == 274_944


def _model(fields: dict, layers: int, dtype):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {**fields, "num_hidden_layers": layers}
    if fields["model_type"] == "gemma3_text":  # every layer full attention: the full forward's shape
        fields["layer_types"] = ["full_attention"] * layers
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).to(dtype).train()


def _batch():
    """8 rows, 2 prompts x 4 samples: prompts of 7 and 5 tokens, 5 completion tokens, right-padded to 12
    columns (the second prompt's rows end 2 columns early, and so does the first row)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 100, (8, 12), generator=generator)
    prompt = torch.tensor([7] * 4 + [5] * 4)
    ids[:4, :7] = ids[0, :7]
    ids[4:, :5] = ids[4, :5]
    length = prompt + 5
    length[0] -= 2
    columns = torch.arange(12)
    mask = (columns < length[:, None]).long()
    completion = ((columns >= prompt[:, None]) & (columns < length[:, None])).long()
    return ids * mask, mask, completion


def _saved_per_layer(fields: dict, forward: str, dtype_name: str = "float32", checkpointing: bool = False) -> int:
    """Bytes of the distinct tensors autograd saves in a 2-layer model less a 1-layer one (parameters
    aside): one layer's activations."""
    import torch

    from grpo_ray.models.packing import packed_completion_logprobs
    from grpo_ray.models.shared_prompts import completion_logprobs

    dtype = getattr(torch, dtype_name)

    def saved(layers: int) -> int:
        model = _model(fields, layers, dtype)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        kept, sizes = [], {}

        def pack(t):
            kept.append(t)  # alive to the end, so no freed storage's address is reused and counted twice
            if t.untyped_storage().data_ptr() not in params:
                sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        ids, mask, completion = _batch()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if forward == "packed":
                packed_completion_logprobs(model, ids, mask, completion)
            else:
                completion_logprobs(model, ids, mask, completion, share_prompts=forward == "shared")
        return sum(sizes.values())

    return saved(2) - saved(1)


@pytest.mark.parametrize("dtype_name, dtype_bytes", [("float32", 4), ("bfloat16", 2)])
def test_the_llama_layer_is_what_autograd_keeps(dtype_name, dtype_bytes):
    # The full forward of _batch: 96 positions, 8 x 12 x 12 mask pairs (the hand-worked figures above).
    expected = layer_activation_bytes(LLAMA, dtype_bytes, 96, 96, 8 * 12 * 12)
    assert _saved_per_layer(LLAMA_FIELDS, "full", dtype_name) == expected


def test_the_gemma_layer_is_what_autograd_keeps():
    # Four norms and q/k norms; its one kv head goes to the kernel as a view: 2 x 32 per key. Gemma's
    # norms also keep 1 + weight in float32, (4 x 64 + 2 x 32) x 4 = 1,280 B a layer: the size of its
    # norms' weights, whatever the batch (not counted).
    gemma = Architecture.from_config({**GEMMA_FIELDS, "num_hidden_layers": 1})
    expected = layer_activation_bytes(gemma, 4, 96, 96, 8 * 12 * 12) + 1_280
    assert _saved_per_layer(GEMMA_FIELDS, "full") == expected


def test_the_shared_prompt_pass_is_what_autograd_keeps():
    # The 2 prompts but their last token (widest 6) run once: 12 positions, 2 x 6 x 6 mask pairs. Then
    # each row's last prompt token and completion (6 columns) attend to 6 + 6 keys: 48 positions,
    # 96 keys, 8 x 6 x 12 pairs.
    expected = layer_activation_bytes(LLAMA, 4, 12 + 48, 12 + 96, 2 * 6 * 6 + 8 * 6 * 12)
    assert _saved_per_layer(LLAMA_FIELDS, "shared") == expected


def test_the_packed_row_is_what_autograd_keeps():
    # The rows' 86 real tokens (10 + 3 x 12 + 4 x 10) end to end under one [86, 86] mask in every layer.
    assert _saved_per_layer(LLAMA_FIELDS, "packed") == layer_activation_bytes(LLAMA, 4, 86, 86, 86 * 86)


def test_gradient_checkpointing_keeps_each_layers_input():
    # 96 positions x 64 x 4 B = 24,576 B a layer; the one layer recomputed in the backward comes later.
    assert _saved_per_layer(LLAMA_FIELDS, "full", checkpointing=True) == 96 * 64 * 4


def test_smollm2_recipe_by_hand():
    # configs/smollm2-arithmetic.yaml: micro-batch 64 = 8 prompts x 8 samples, 64 + 16 = 80 tokens,
    # float32, prompts shared. SmolLM2-135M: hidden 576, 9 heads x 64 over 3 kv heads (copied),
    # intermediate 1536, 30 layers. Per query position: norms 1,152 x 8 + 2 x 4 = 9,224; linear inputs
    # 2 x 576 x 4 = 4,608; q + output 4,608; logsumexp 36; MLP 4 x 1536 x 4 = 24,576 = 43,052 B. Per
    # key 2 x 576 x 4 = 4,608 B.
    #   positions: 8 prompts x 63 + 64 rows x 17 (last prompt token + 16) = 504 + 1,088 = 1,592
    #   keys: 504 + 64 x 80 = 5,624; mask pairs: 8 x 63 x 63 + 64 x 17 x 80 = 31,752 + 87,040 = 118,792
    #   a layer: 1,592 x 43,052 + 5,624 x 4,608 + 118,792 x 4 = 94,929,344 B; x 30 = 2,847,880,320
    #   + the KV cache until the forward ends: 64 x 2 x 30 x 80 x 3 x 64 x 4 = 235,929,600
    #   = 3,083,809,920 B (2.87 GiB)
    term = learner_activations(load_config(CONFIGS / "smollm2-arithmetic.yaml"), SMOLLM2, 4)
    assert (term.bytes, term.rows, term.tokens, term.how) == (3_083_809_920, 64, 80, "8 prompts once")


def test_smollm2_without_the_shared_pass_and_with_checkpointing():
    # share_prompts off: 5,120 positions and keys, 64 x 80 x 80 = 409,600 pairs: 5,120 x (43,052 +
    # 4,608) + 409,600 x 4 = 245,657,600 B a layer, x 30 = 7,369,728,000 B (6.86 GiB).
    path = CONFIGS / "smollm2-arithmetic.yaml"
    full = learner_activations(load_config(path, ["learner.share_prompts=false"]), SMOLLM2, 4)
    assert (full.bytes, full.how) == (7_369_728_000, "")
    # Checkpointed: each layer's input, 30 x 5,120 x 576 x 4 = 353,894,400, and one layer recomputed.
    kept = learner_activations(load_config(path, ["learner.gradient_checkpointing=true"]), SMOLLM2, 4)
    assert (kept.bytes, kept.how) == (353_894_400 + 245_657_600, "checkpointed")
    # Packed: one row of 5,120 positions under a [5120, 5120] mask in every layer (104,857,600 B).
    packed = learner_activations(load_config(path, ["learner.packing=true"]), SMOLLM2, 4)
    assert (packed.bytes, packed.rows, packed.tokens) == (30 * (244_019_200 + 104_857_600), 1, 5120)


def test_gemma3_recipe_by_hand():
    # configs/gemma3-arithmetic.yaml: micro-batch 16, 64 + 8 = 72 tokens, float32; sliding layers keep
    # no plain cache, so the full forward. Gemma 3 270M: hidden 640, 4 heads x 256 over 1 kv head (a
    # view), intermediate 2048, 4 norms and q/k norms, 18 layers. Per query: norms (4 x 640 + 1024 + 256)
    # x 8 + (4 + 4 + 1) x 4 = 30,756; linear inputs 5,120; q + output 8,192; logsumexp 16; MLP 32,768
    # = 76,852 B. Per key 2 x 256 x 4 = 2,048 B. 16 x 72 = 1,152 positions, 16 x 72 x 72 = 82,944 pairs:
    # 1,152 x 78,900 + 82,944 x 4 = 91,224,576 B a layer, x 18 = 1,642,042,368 B (1.53 GiB).
    term = learner_activations(load_config(CONFIGS / "gemma3-arithmetic.yaml"), GEMMA, 4)
    assert (term.bytes, term.rows, term.tokens, term.how) == (1_642_042_368, 16, 72, "")
