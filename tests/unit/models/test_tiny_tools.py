"""The tiny-tools model (models/tiny_tools.py): its tool call is the Hermes format in 9 tokens, its
pre-training transcripts train on the assistant's tokens only, its shipped weights are checked."""

import numpy as np
import pytest

from grpo_ray.envs.tool_calls import ToolCall, parse_tool_calls
from grpo_ray.models.tiny_tools import (
    SHIPPED,
    SHIPPED_SHA256,
    build_tools_tokenizer,
    ensure_tiny_tools_artifacts,
    make_product_split,
    tool_call,
    transcript,
)
from grpo_ray.models.tiny_weights import load_shipped_weights


def test_a_call_is_the_hermes_format_in_nine_tokens():
    tokenizer = build_tools_tokenizer()
    ids = tokenizer.encode(tool_call(123, 456), add_special_tokens=False)
    assert len(ids) == 9
    assert parse_tool_calls(tokenizer.decode(ids)).calls == (ToolCall("multiply", {"a": 123, "b": 456}),)


def test_the_products_split_is_disjoint_and_three_digit():
    train, heldout = make_product_split()
    assert (len(train), len(heldout)) == (4000, 200)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in heldout}
    a, b = heldout[0]["prompt"].rstrip("=").split("*")
    assert 100 <= int(a) <= 999 and 100 <= int(b) <= 999 and heldout[0]["answer"] == str(int(a) * int(b))


def test_a_transcript_trains_on_the_assistants_tokens_only():
    tokenizer = build_tools_tokenizer()
    row = {"prompt": "123*456=", "answer": "56088"}
    ids, mask = transcript(tokenizer, row, use_tool=True, guess="1")
    text = tokenizer.decode(ids)
    assert tool_call(123, 456) in text and "tool\n56088" in text
    trained = tokenizer.decode(np.asarray(ids)[np.asarray(mask) == 1])
    assert trained == tool_call(123, 456) + "<|im_end|>56088<|im_end|>"
    ids, mask = transcript(tokenizer, row, use_tool=False, guess="4242")
    assert tokenizer.decode(np.asarray(ids)[np.asarray(mask) == 1]) == "4242<|im_end|>"


def test_the_shipped_weights_are_the_ones_built_and_a_changed_file_is_refused(tmp_path):
    art = ensure_tiny_tools_artifacts(tmp_path)
    assert (art.model_dir / "config.json").exists() and art.heldout_file.exists()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(art.model_dir)
    changed = tmp_path / "changed.safetensors"
    changed.write_bytes(SHIPPED.read_bytes()[:-1] + b"\x00")
    with pytest.raises(RuntimeError, match="sha256 .* expected 8fe6418521bb"):
        load_shipped_weights(model, changed, SHIPPED_SHA256, "python -m grpo_ray.models.tiny_tools --pretrain")
