"""Tool schemas from signatures and docstrings; tool calls read from a model's text."""

from grpo_ray.envs.tool_calls import ToolCall, parse_tool_calls, render_tool_call
from grpo_ray.envs.tools import tool_schema


def multiply(a: int, b: int, exact: bool = True) -> int:
    """Multiply two whole numbers.

    Longer explanation that is not the description.

    Args:
        a: the first factor
        b: the second factor, which may be
            described over two lines
        exact (bool): whether to round
    """
    return a * b


class Shop:
    def price(self, item: str, quantity: float | None = None) -> float:
        """The price of an item."""
        return 1.0


def test_a_schema_from_signature_and_docstring():
    assert tool_schema(multiply) == {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two whole numbers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "the first factor"},
                    "b": {"type": "integer", "description": "the second factor, which may be described over two lines"},
                    "exact": {"type": "boolean", "description": "whether to round"},
                },
                "required": ["a", "b"],
            },
        },
    }


def test_a_bound_methods_schema_leaves_self_out_and_reads_optional_types():
    schema = tool_schema(Shop().price)["function"]
    assert schema["parameters"]["properties"] == {"item": {"type": "string"}, "quantity": {"type": "number"}}
    assert schema["parameters"]["required"] == ["item"] and schema["description"] == "The price of an item."


def test_calls_are_read_in_order_and_an_answer_has_none():
    text = (
        'Let me compute. <tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>'
        '<tool_call>{"name": "price", "arguments": "{\\"item\\": \\"pen\\"}"}</tool_call>'
    )
    turn = parse_tool_calls(text)
    assert turn.calls == (ToolCall("multiply", {"a": 12, "b": 34}), ToolCall("price", {"item": "pen"}))
    assert turn.errors == () and not turn.is_answer
    assert parse_tool_calls("408").is_answer


def test_a_call_that_is_not_valid_is_reported_never_guessed():
    assert parse_tool_calls("<tool_call>{name: multiply}</tool_call>").errors[0].startswith("not JSON (")
    assert parse_tool_calls('<tool_call>["multiply"]</tool_call>').errors[0].startswith('not {"name": ...')
    assert (
        parse_tool_calls('<tool_call>{"name": "f", "arguments": [1]}</tool_call>')
        .errors[0]
        .startswith("the arguments of 'f' are not an object")
    )
    unclosed = parse_tool_calls('<tool_call>{"name": "f"}')
    assert unclosed.errors == ("a <tool_call> block without </tool_call>",) and not unclosed.is_answer


def test_a_rendered_call_parses_back():
    call = ToolCall("multiply", {"a": 3, "b": 4})
    assert parse_tool_calls(render_tool_call(call)).calls == (call,)
