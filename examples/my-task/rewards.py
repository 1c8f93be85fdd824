"""A reward of your own: the TRL contract, fn(completions, **row_fields) -> one float (or None) each.

Full marks for the exact sum, a little for a number that is off by less than 10, nothing otherwise.
`answers` holds each row's "answer" field; every other field of the row arrives by its own name.
"""


def close_sum(completions, answers, **row_fields):
    scores = []
    for completion, answer in zip(completions, answers):
        text = completion.strip()
        if not text.lstrip("-").isdigit():
            scores.append(0.0)
        elif int(text) == int(answer):
            scores.append(1.0)
        else:
            scores.append(0.2 if abs(int(text) - int(answer)) < 10 else 0.0)
    return scores
