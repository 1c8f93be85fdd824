"""What a tokenizer's chat template writes after a model's finished turn when other messages follow
(a tool's result, an environment's reply), measured by rendering a fixed conversation: no template is
parsed, so it holds for any template that renders earlier turns the same once more follow.

Both an episode's rows (envs/episode.py) and the tiny-tools model's pre-training transcripts
(models/tiny_tools.py) put these tokens between the model's turns; it lives below both packages.
"""

from __future__ import annotations

from collections.abc import Callable

# render(messages, add_generation_prompt) -> token ids: the tokenizer's chat template.
Render = Callable[[list[dict], bool], list[int]]
_PROBE = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def reply_tokens(render: Render, end_of_turn: int, reply: list[dict]) -> list[int]:
    """The tokens that follow a model's turn (which ends with `end_of_turn`) when `reply` comes
    next and the model then speaks: the template's markup after the turn (ChatML's newline), the
    reply's messages, and the generation prompt of the next assistant turn."""
    base = render(_PROBE, False)
    full = render(_PROBE + list(reply), True)
    if full[: len(base)] != base:
        raise ValueError("the chat template renders earlier turns differently once a reply follows them")
    if end_of_turn not in base:
        raise ValueError(f"the chat template does not end an assistant turn with token {end_of_turn}")
    after_turn = base[len(base) - base[::-1].index(end_of_turn) :]
    return after_turn + full[len(base) :]
