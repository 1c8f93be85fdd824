"""The offline tiny model: tokenizer, model shape, pre-training batch, cached build.

tests/conftest.py sets one torch thread and passive OpenMP before torch is imported.
"""

import json
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_ray.models.tiny_task import addition_problem, make_addition_split, read_jsonl
from grpo_ray.models import tiny, tiny_weights

CHAT_PROMPT = "<|im_start|>user\n37+45=<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer():
    return tiny.build_tiny_tokenizer()


@pytest.fixture(scope="module")
def fast_build(tmp_path_factory):
    """A real build with 5 pre-training steps (a few seconds); its accuracy is meaningless."""
    return tiny.ensure_tiny_artifacts(tmp_path_factory.mktemp("cache"), pretrain_steps=5)


# ---- tokenizer ---------------------------------------------------------------------------------


def test_one_token_per_character_and_small_vocabulary(tokenizer):
    ids = tokenizer("37+45=", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == list("37+45=")
    assert len(tokenizer) < 64


def test_chat_template(tokenizer):
    user = [{"role": "user", "content": "37+45="}]
    assert tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True) == CHAT_PROMPT
    assert tokenizer.apply_chat_template(user, tokenize=False) == "<|im_start|>user\n37+45=<|im_end|>\n"
    with_system = [{"role": "system", "content": "add"}, *user]
    assert tokenizer.apply_chat_template(with_system, tokenize=False).startswith(
        "<|im_start|>system\nadd<|im_end|>\n<|im_start|>user\n"
    )


def test_chat_prompt_is_fourteen_tokens(tokenizer):
    # im_start, "user", "\n", 6 characters, im_end, "\n", im_start, "assistant", "\n".
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(CHAT_PROMPT)["input_ids"])
    assert len(tokens) == 14
    assert tokens[:3] == ["<|im_start|>", "user", "Ċ"]  # byte-level spelling of "\n"
    assert tokens[-3:] == ["<|im_start|>", "assistant", "Ċ"]


def test_special_tokens(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert (tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids("<|im_start|>"), tokenizer.eos_token_id) == (
        0,
        1,
        2,
    )
    assert tokenizer.bos_token is None
    assert tokenizer("37")["input_ids"] == tokenizer("37", add_special_tokens=False)["input_ids"]


def test_decode_gives_back_plain_text(tokenizer):
    text = "hello world,  x\n\n y 1+2=3 (a) ?: users"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    completion = tokenizer("82<|im_end|><|endoftext|>")["input_ids"]
    assert tokenizer.decode(completion, skip_special_tokens=True) == "82"
    # Role words are ordinary (added) tokens: they survive skip_special_tokens.
    assert (
        tokenizer.decode(tokenizer(CHAT_PROMPT)["input_ids"], skip_special_tokens=True) == "user\n37+45=\nassistant\n"
    )


def test_characters_outside_the_vocabulary_are_dropped(tokenizer):
    # Qwen2's byte-level BPE has no unknown token; documented in build_tiny_tokenizer.
    assert tokenizer.decode(tokenizer("A1é")["input_ids"]) == "1"


def test_round_trip_through_auto_tokenizer_in_a_qwen2_folder(tmp_path, tokenizer):
    # With a qwen2 config.json beside it, transformers loads the tokenizer as Qwen2Tokenizer,
    # which rebuilds its pipeline from the saved vocabulary: the encodings must not change.
    tiny.build_tiny_model(len(tokenizer), seed=0).config.save_pretrained(tmp_path)
    tiny.save_tiny_tokenizer(tokenizer, tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in [CHAT_PROMPT + "82<|im_end|>", "hello world,  x\n\n y", "users assistant system"]:
        assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded.chat_template == tokenizer.chat_template
    assert (loaded.eos_token_id, loaded.pad_token_id, len(loaded)) == (2, 0, len(tokenizer))


# ---- model and pre-training batch ----------------------------------------------------------------


def test_model_shape(tokenizer):
    model = tiny.build_tiny_model(len(tokenizer), seed=0)
    cfg = model.config
    assert (
        cfg.model_type,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.intermediate_size,
        cfg.max_position_embeddings,
    ) == ("qwen2", 128, 2, 2, 2, 512, 128)
    assert cfg.hidden_size // cfg.num_attention_heads == 64  # a head size vLLM's CPU attention has
    assert (cfg.eos_token_id, cfg.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    assert model.dtype == torch.float32
    logits = model(torch.tensor([[1, 53, 25]])).logits
    assert logits.shape == (1, 3, len(tokenizer))


def test_model_init_depends_only_on_seed(tokenizer):
    a, b = (tiny.build_tiny_model(len(tokenizer), seed=3) for _ in range(2))
    c = tiny.build_tiny_model(len(tokenizer), seed=4)
    assert torch.equal(a.model.layers[0].mlp.up_proj.weight, b.model.layers[0].mlp.up_proj.weight)
    assert not torch.equal(a.model.layers[0].mlp.up_proj.weight, c.model.layers[0].mlp.up_proj.weight)


def test_supervised_batch_labels_only_answer_and_eos(tokenizer):
    rows = [addition_problem(37, 45), addition_problem(50, 50)]
    input_ids, attention_mask, labels = tiny._supervised_batch_tensors(tokenizer, rows)
    # 14 prompt tokens + "82" + eos = 17, padded to 18 by the 3-digit row: 14 + "100" + eos.
    assert input_ids.shape == labels.shape == attention_mask.shape == (2, 18)
    assert tokenizer.decode(input_ids[1]) == CHAT_PROMPT.replace("37+45", "50+50") + "100<|im_end|>"
    assert tokenizer.decode(labels[0][labels[0] != -100]) == "82<|im_end|>"
    assert tokenizer.decode(labels[1][labels[1] != -100]) == "100<|im_end|>"
    assert (labels[0, :14] == -100).all() and labels[0, 17] == -100
    assert attention_mask[0].tolist() == [1] * 17 + [0]
    assert input_ids[0, 17] == tokenizer.pad_token_id


def test_pretraining_lowers_the_loss(tokenizer):
    train = make_addition_split(seed=0)[0][:256]
    model = tiny.build_tiny_model(len(tokenizer), seed=0)
    input_ids, attention_mask, labels = tiny._supervised_batch_tensors(tokenizer, train)
    with torch.no_grad():
        before = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    tiny.pretrain_tiny(model, tokenizer, train, steps=30, batch_size=32, lr=1e-3, seed=0)
    with torch.no_grad():
        after = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    # Untrained, the loss is about ln(55) = 4.0; 30 steps learn at least the output format.
    assert before > 3.5 and after < 2.0


# ---- cached build ------------------------------------------------------------------------------


def test_fast_build_layout(fast_build, tokenizer):
    art = fast_build
    assert art.model_dir.parent.name == "tiny-v2-seed1-steps5"  # never shadows the real build
    assert (art.model_dir.parent / "READY").exists()
    assert (art.model_dir / "model.safetensors").exists()
    assert read_jsonl(art.heldout_file) == make_addition_split(tiny.SEED)[1]
    assert len(read_jsonl(art.train_file)) == 7600
    assert art.info["pretrain_steps"] == 5 and art.info["seed"] == tiny.SEED
    assert 0.0 <= art.info["start_heldout_accuracy"] <= 1.0
    assert not [p for p in art.model_dir.parents[1].iterdir() if ".tmp-" in p.name]


def test_fast_build_loads_with_auto_classes(fast_build, tokenizer):
    loaded = AutoTokenizer.from_pretrained(fast_build.model_dir)
    model = AutoModelForCausalLM.from_pretrained(fast_build.model_dir)
    assert loaded(CHAT_PROMPT)["input_ids"] == tokenizer(CHAT_PROMPT)["input_ids"]
    assert loaded.padding_side == "right"  # the build's left-padded evaluation did not leak
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.dtype == torch.float32
    assert model.generation_config.eos_token_id == loaded.eos_token_id


def test_second_call_returns_at_once_without_rebuilding(fast_build, monkeypatch):
    def no_rebuild(*args, **kwargs):
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(tiny, "_build", no_rebuild)
    started = time.perf_counter()
    again = tiny.ensure_tiny_artifacts(fast_build.model_dir.parents[1], pretrain_steps=5)
    assert again == fast_build
    assert time.perf_counter() - started < 0.5


def _fake_build(calls, delay=0.0):
    def build(out_dir, *, pretrain_steps, seed, pretrain=True):
        calls.append(out_dir)
        time.sleep(delay)
        (out_dir / "model").mkdir()
        (out_dir / "model" / tiny.INFO_FILE).write_text(json.dumps({"seed": seed}))
        (out_dir / tiny.MARKER_FILE).write_text("ok\n")

    return build


def test_concurrent_callers_build_once(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(tiny, "_build", _fake_build(calls, delay=0.3))
    results = []
    threads = [threading.Thread(target=lambda: results.append(tiny.ensure_tiny_artifacts(tmp_path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(results) == 3 and len(set(results)) == 1
    assert results[0].model_dir == tmp_path / "tiny-v2" / "model"


def test_failed_build_leaves_no_folder_and_a_later_call_builds(tmp_path, monkeypatch):
    def broken(out_dir, *, pretrain_steps, seed, pretrain=True):
        (out_dir / "train.jsonl").write_text("partial")
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(tiny, "_build", broken)
    with pytest.raises(RuntimeError, match="mid-build"):
        tiny.ensure_tiny_artifacts(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-v2.lock"]

    calls = []
    monkeypatch.setattr(tiny, "_build", _fake_build(calls))
    assert tiny.ensure_tiny_artifacts(tmp_path).model_dir.exists()
    assert len(calls) == 1


def test_folder_without_marker_is_rebuilt(tmp_path, monkeypatch):
    (tmp_path / "tiny-v2").mkdir()
    (tmp_path / "tiny-v2" / "stale.bin").write_text("x")
    calls = []
    monkeypatch.setattr(tiny, "_build", _fake_build(calls))
    tiny.ensure_tiny_artifacts(tmp_path)
    assert len(calls) == 1 and not (tmp_path / "tiny-v2" / "stale.bin").exists()


def test_default_cache_dir_reads_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_RAY_CACHE", str(tmp_path))
    assert tiny.default_cache_dir() == tmp_path
    calls = []
    monkeypatch.setattr(tiny, "_build", _fake_build(calls))
    assert tiny.ensure_tiny_artifacts().model_dir == tmp_path / "tiny-v2" / "model"


@pytest.mark.slow
def test_default_build_starts_low_but_not_zero(tmp_path, capsys):
    """The real recipe, from the shipped weights: held-out accuracy must leave GRPO room to work."""
    art = tiny.ensure_tiny_artifacts(tmp_path)
    info = art.info
    assert (info["seed"], info["pretrain_steps"]) == (tiny.SEED, tiny.PRETRAIN_STEPS)
    assert info["weights"] == "shipped (tiny_v2.safetensors)"
    assert 0.03 < info["start_heldout_accuracy"] < 0.40
    # What was saved is what was measured: reload from disk and evaluate again.
    model = AutoModelForCausalLM.from_pretrained(art.model_dir)
    loaded = AutoTokenizer.from_pretrained(art.model_dir)
    accuracy = tiny.greedy_accuracy(model, loaded, read_jsonl(art.heldout_file))
    assert accuracy == pytest.approx(info["start_heldout_accuracy"], abs=0.01)

    tiny.main(["--out", str(tmp_path)])  # cached: prints at once
    out = capsys.readouterr().out
    assert str(art.model_dir) in out and "start held-out greedy accuracy" in out


def test_shipped_weights_that_are_not_the_shipped_file_fail_naming_it(tmp_path, tokenizer):
    # A truncated or edited copy would change every figure without a word.
    copy = tmp_path / "tiny_v2.safetensors"
    data = bytearray(tiny_weights.SHIPPED_WEIGHTS.read_bytes())
    data[-1] ^= 1
    copy.write_bytes(bytes(data))
    model = tiny.build_tiny_model(len(tokenizer), seed=tiny.SEED)
    with pytest.raises(RuntimeError, match="tiny_v2.safetensors: sha256"):
        tiny_weights.load_shipped_weights(model, copy)


def test_shipped_weights_load_into_the_tied_model(tokenizer):
    model = tiny.build_tiny_model(
        len(tokenizer), seed=tiny.SEED, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    before = model.model.layers[0].mlp.up_proj.weight.clone()
    tiny_weights.load_shipped_weights(model)
    assert not torch.equal(before, model.model.layers[0].mlp.up_proj.weight)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
