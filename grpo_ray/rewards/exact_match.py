"""Exact-match reward: 1.0 when the completion is the answer, character for character.

This is the reward of the tiny arithmetic task ("37+45=" -> "82"), where the policy is asked for
the bare answer and nothing else, so any extra text is a wrong answer.

Example:
    >>> exact_match(["82", " 82\\n<|im_end|>", "82."], ["37+45="] * 3, ["82"] * 3)
    [1.0, 1.0, 0.0]
"""

from __future__ import annotations

# End-of-turn markers a chat template may leave at the end of a completion when the engine does
# not strip special tokens. They are the tokenizer's, not the model's answer, so they never count.
END_OF_TURN_MARKERS: tuple[str, ...] = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "</s>",
)


def strip_completion(text: str) -> str:
    """Strip surrounding whitespace and any trailing end-of-turn markers.

    >>> strip_completion("  82 <|im_end|><|endoftext|>\\n")
    '82'
    """
    text = text.strip()
    # Loop because templates can stack markers ("<|im_end|><|endoftext|>").
    while True:
        for marker in END_OF_TURN_MARKERS:
            if text.endswith(marker):
                text = text[: -len(marker)].rstrip()
                break
        else:
            return text


def exact_match(completions: list[str], prompts: list[str], answers: list[str], **_row_fields) -> list[float | None]:
    """1.0 where the stripped completion equals the stripped answer, else 0.0.

    Unknown keyword arguments (other dataset columns) are accepted and ignored, as the reward
    contract requires.

    >>> exact_match(["82", "83"], ["37+45=", "37+45="], ["82", "82"], difficulty=[1, 1])
    [1.0, 0.0]
    """
    return [
        1.0 if strip_completion(completion) == str(answer).strip() else 0.0
        for completion, answer in zip(completions, answers, strict=True)
    ]
