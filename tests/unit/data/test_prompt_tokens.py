"""A plain-text prompt is tokenised as the model's own tokenizer makes a text: the special tokens it
adds before one (a BOS for Llama- and Gemma-style tokenizers, none for Qwen2's), once; a trailing
EOS never; a chat-templated prompt is the template's tokens alone, never a second BOS. Real
tokenizers: the Qwen2 one in ../shared/tokenizers, the project's tiny one, and the tiny one given
a Llama-style post-processor (the tokenizers library's own TemplateProcessing, as Llama 2's
tokenizer.json has it). Gemma 3's restored tokenizer: tests/integration/test_gemma3.py."""

import copy
from pathlib import Path

import pytest
from tokenizers import AddedToken
from tokenizers.processors import TemplateProcessing

from grpo_ray.data.loaders import Row
from grpo_ray.data.prompts import leading_special_tokens, text_prompt_ids, tokenize_prompts
from grpo_ray.models.loading import load_tokenizer

QWEN2 = Path(__file__).resolve().parents[3].parent / "shared" / "tokenizers" / "qwen2"
TEXT = "Question: What is 13 + 5?\nAnswer:"


def with_template(tokenizer, single: str):
    """The tiny tokenizer with "<s>" and "</s>" as special tokens and a post-processor `single`
    ("<s> $A" as Llama 2's; "<s> $A </s>" as a tokenizer that also ends each text)."""
    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"bos_token": AddedToken("<s>", special=True), "additional_special_tokens": ["</s>"]})
    specials = [(t, tok.convert_tokens_to_ids(t)) for t in ("<s>", "</s>") if t in single]
    tok.backend_tokenizer.post_processor = TemplateProcessing(single=single, special_tokens=specials)
    return tok


@pytest.fixture(scope="module")
def tiny():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def llama_style(tiny):
    return with_template(tiny, "<s> $A")


def rows(*texts: str) -> list[Row]:
    return [Row(index=i, prompt=t, answer="18", fields={}) for i, t in enumerate(texts)]


def test_a_tokenizer_that_adds_a_bos_gives_every_text_prompt_its_bos_once(llama_style):
    bos = llama_style.convert_tokens_to_ids("<s>")
    assert leading_special_tokens(llama_style) == (bos,)
    prompts = tokenize_prompts(rows(TEXT, "<s>" + TEXT), llama_style, 10**6, apply_chat_template=False).prompts
    # What tokenizer(text) gives, as vLLM's text prompts and transformers' generate examples do.
    assert list(prompts[0].token_ids) == llama_style(TEXT)["input_ids"]
    assert prompts[0].token_ids[0] == bos and prompts[0].token_ids[1] != bos
    # A user who typed the BOS into the text gets one, not two.
    assert prompts[1].token_ids == prompts[0].token_ids


def test_a_tokenizer_that_adds_nothing_leaves_the_text_alone(tiny):
    qwen2 = load_tokenizer(str(QWEN2))
    for tokenizer in (qwen2, tiny):
        assert leading_special_tokens(tokenizer) == ()
        [prompt] = tokenize_prompts(rows(TEXT), tokenizer, 10**6, apply_chat_template=False).prompts
        assert list(prompt.token_ids) == tokenizer(TEXT, add_special_tokens=False)["input_ids"]


def test_a_trailing_eos_that_a_tokenizer_adds_is_not_put_at_the_end_of_a_prompt(tiny):
    tok = with_template(tiny, "<s> $A </s>")
    assert tok(TEXT)["input_ids"][-1] == tok.convert_tokens_to_ids("</s>")
    assert leading_special_tokens(tok) == (tok.convert_tokens_to_ids("<s>"),)
    ids = text_prompt_ids(TEXT, tok, leading_special_tokens(tok))
    assert ids == tok(TEXT)["input_ids"][:-1]


def test_a_chat_templated_prompt_is_the_templates_tokens_with_no_second_bos(tiny, llama_style):
    qwen2 = load_tokenizer(str(QWEN2))
    for tokenizer in (qwen2, llama_style):
        [prompt] = tokenize_prompts(rows(TEXT), tokenizer, 10**6, apply_chat_template=True).prompts
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": TEXT}], add_generation_prompt=True)
        rendered = rendered["input_ids"] if hasattr(rendered, "keys") else rendered
        assert list(prompt.token_ids) == list(rendered)
    # The tiny template writes no BOS; the Llama-style tokenizer's additions are not put before it.
    [templated] = tokenize_prompts(rows(TEXT), llama_style, 10**6, apply_chat_template=True).prompts
    assert llama_style.convert_tokens_to_ids("<s>") not in templated.token_ids


def test_the_bos_counts_toward_max_prompt_tokens(llama_style):
    length = len(llama_style(TEXT, add_special_tokens=False)["input_ids"])
    kept = tokenize_prompts(rows(TEXT), llama_style, length + 1, apply_chat_template=False)
    dropped = tokenize_prompts(rows(TEXT), llama_style, length, apply_chat_template=False)
    assert (len(kept.prompts), kept.dropped_too_long) == (1, 0)
    assert (len(dropped.prompts), dropped.dropped_too_long) == (0, 1)
