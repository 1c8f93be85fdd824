"""Chat-list prompts read whole, from a file to the tokens the model sees: the system message and
earlier turns of a verl-style parquet row are rendered by the chat template before the user's
message; a row that cannot be a prompt stops the load with one line naming the file and record."""

from pathlib import Path

import pytest

from grpo_ray.data.loaders import DataError, load_rows
from grpo_ray.data.prompts import tokenize_prompts
from grpo_ray.models.loading import load_tokenizer

pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")

MATH_EVAL = Path("/work/shared/data/math-eval")
SYSTEM = {"role": "system", "content": "Answer with the number only."}
TURNS = [
    SYSTEM,
    {"role": "user", "content": "What is 1+1?"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "And 2+2?"},
]


def verl_parquet(path: Path, prompts: list[list[dict]]) -> str:
    """A verl-shaped parquet file: `prompt` a list of {role, content} structs, as verl writes."""
    records = [
        {"data_source": "hand", "prompt": prompt, "reward_model": {"ground_truth": str(i), "style": "rule"}}
        for i, prompt in enumerate(prompts)
    ]
    pq.write_table(pa.Table.from_pylist(records), path)
    return str(path)


def test_a_verl_prompt_reaches_the_model_whole(tmp_path):
    spec = verl_parquet(tmp_path / "train.parquet", [[SYSTEM, TURNS[1]], TURNS, [TURNS[1]]])
    rows, skipped = load_rows(spec)
    assert skipped == 0
    assert [(row.prompt, row.context) for row in rows] == [
        ("What is 1+1?", (SYSTEM,)),
        ("And 2+2?", tuple(TURNS[:3])),
        ("What is 1+1?", ()),
    ]
    tokenizer = load_tokenizer("tiny")
    prompts = tokenize_prompts(rows, tokenizer, max_prompt_tokens=10**6, apply_chat_template=True).prompts

    def rendered(chat: list[dict]) -> tuple[int, ...]:
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        return tuple(ids["input_ids"] if hasattr(ids, "keys") else ids)

    for prompt, chat in zip(prompts, [[SYSTEM, TURNS[1]], TURNS, [TURNS[1]]]):
        assert prompt.token_ids == rendered(chat)
        assert prompt.text == chat[-1]["content"] and list(prompt.context) == chat[:-1]
    # What the last user message alone renders to, as before: shorter than the whole chat.
    assert len(prompts[1].token_ids) > len(rendered(TURNS[3:])) + 10


def test_a_prompt_that_cannot_be_read_whole_is_refused_naming_file_and_record(tmp_path):
    spec = verl_parquet(tmp_path / "train.parquet", [[TURNS[1]], [TURNS[1], TURNS[2]]])
    with pytest.raises(DataError) as refused:
        load_rows(spec)
    assert str(refused.value) == (
        f"{spec}: record 1 (counting from 0): the prompt's last message is the assistant's, not the user's; "
        "end each prompt with the user message the model answers (a chat template's generation prompt starts "
        "a new assistant turn)"
    )


def test_context_without_a_chat_template_is_refused_naming_the_field(tmp_path):
    rows, _ = load_rows(verl_parquet(tmp_path / "train.parquet", [[TURNS[1]], [SYSTEM, TURNS[1]]]))
    with pytest.raises(DataError, match=r"^data.apply_chat_template is false, but prompt 1 has messages before the "):
        tokenize_prompts(rows, load_tokenizer("tiny"), max_prompt_tokens=10**6, apply_chat_template=False)
    plain = tokenize_prompts(rows[:1], load_tokenizer("tiny"), max_prompt_tokens=10**6, apply_chat_template=False)
    assert len(plain.prompts) == 1


@pytest.mark.parametrize("name", ["aime24", "aime25", "amc23"])
def test_the_benchmark_parquet_loads_with_the_prompts_it_had(name):
    path = MATH_EVAL / f"{name}.parquet"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    records = pq.read_table(path).to_pylist()
    rows, skipped = load_rows(str(path))
    assert skipped == 0 and len(rows) == len(records)
    # Each prompt is one user message: its text as before (that message's content), no context.
    for row, record in zip(rows, records):
        [message] = record["prompt"]
        assert (row.prompt, row.context) == (message["content"], ())
