"""An agent's episode starts from the prompt as the data gave it: a prompt with a system message or
earlier turns reaches the environment's row as `prompt_messages`, and the default resets (an
Environment's, a tool set's) open the episode with that whole chat, not the user's message alone."""

import json

from grpo_ray.actors.episodes import episode_inputs
from grpo_ray.data.loaders import load_rows
from grpo_ray.data.prompts import tokenize_prompts
from grpo_ray.envs import Environment, ToolEnvironment
from grpo_ray.models.loading import load_tokenizer
from grpo_ray.types import Prompt, SamplingSettings

SYSTEM = {"role": "system", "content": "You may call multiply."}
CHAT = Prompt(uid=0, text="What is 12*34?", token_ids=(1, 2), answer="408", fields={"level": 1}, context=(SYSTEM,))
TEXT = Prompt(uid=1, text="What is 5*6?", token_ids=(3,), answer="30")


class Calculator:
    """A TRL environment_factory class whose reset returns an observation."""

    def reset(self, **row):
        return "You have 1 call."

    def multiply(self, a: int, b: int) -> int:
        """Multiply two whole numbers.

        Args:
            a: the first factor
            b: the second factor
        """
        return a * b


def test_the_episode_row_carries_the_whole_chat_only_where_there_is_one():
    rows, _, _ = episode_inputs(
        [CHAT, TEXT], 0, SamplingSettings(samples_per_prompt=2, max_new_tokens=4, temperature=1)
    )
    user = {"role": "user", "content": "What is 12*34?"}
    assert (
        rows[0]
        == rows[1]
        == {"prompt": "What is 12*34?", "answer": "408", "level": 1, "prompt_messages": [SYSTEM, user]}
    )
    assert rows[2] == {"prompt": "What is 5*6?", "answer": "30"}  # a TRL class's reset(**row) gets no new keyword


def test_the_default_resets_open_the_episode_with_the_whole_chat():
    rows, _, _ = episode_inputs(
        [CHAT, TEXT], 0, SamplingSettings(samples_per_prompt=1, max_new_tokens=4, temperature=1)
    )
    user = {"role": "user", "content": "What is 12*34?"}
    assert Environment().reset(rows[0]) == [SYSTEM, user]
    assert Environment().reset(rows[1]) == [{"role": "user", "content": "What is 5*6?"}]
    # A tool set's observation goes on the user's message, not on the system message before it.
    opened = ToolEnvironment(Calculator()).reset(rows[0])
    assert opened == [SYSTEM, {"role": "user", "content": "What is 12*34?\nYou have 1 call."}]
    assert rows[0]["prompt_messages"][0] == SYSTEM  # the row's messages are not changed by the episode


def test_the_rows_docs_agents_md_shows_are_the_rows_reset_gets(tmp_path):
    # docs/agents.md, "The data rows": these two JSON lines and the rows they become.
    system = {"role": "system", "content": "Use the calculator."}
    user = {"role": "user", "content": "What is 764 * 303?"}
    records = [
        {"prompt": "What is 221 * 722? Answer with just the number.", "answer": 159562, "level": 2},
        {"prompt": [system, user], "answer": "231492", "level": 3},
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    rows, _ = load_rows(str(path))
    prompts = tokenize_prompts(rows, load_tokenizer("tiny"), max_prompt_tokens=10**6, apply_chat_template=True).prompts
    episode_rows, _, _ = episode_inputs(
        prompts, 0, SamplingSettings(samples_per_prompt=1, max_new_tokens=4, temperature=1)
    )
    assert episode_rows == [
        {"prompt": "What is 221 * 722? Answer with just the number.", "answer": "159562", "level": 2},
        {"prompt": "What is 764 * 303?", "answer": "231492", "level": 3, "prompt_messages": [system, user]},
    ]
