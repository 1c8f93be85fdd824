"""The one helper for an error's first line (grpo_ray/errors.py)."""

from grpo_ray.errors import first_line


def test_the_first_non_empty_line_or_the_type_name():
    assert first_line(ValueError("\n  bad value  \nTraceback ...")) == "bad value"
    assert first_line(KeyError()) == "KeyError"
    assert first_line("plain text\nmore") == "plain text"
    assert first_line("") == ""


def test_with_the_type_and_a_limit():
    assert first_line(ZeroDivisionError("division by zero"), with_type=True) == "ZeroDivisionError: division by zero"
    assert first_line(OSError(), with_type=True) == "OSError"
    assert first_line("x" * 300, limit=200) == "x" * 197 + "..."
    assert first_line("short", limit=200) == "short"
