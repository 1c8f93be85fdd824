"""configs/smollm2-tools.yaml's environment (examples/agents/shown_calculator.py), loaded as a run
loads it: the first messages show the tool and a worked call in the format grpo-ray parses, and
the step rewards pay for a call that ran (1.0), a call that did not (0.25), an answer (0)."""

from pathlib import Path

from grpo_ray.config import load_config
from grpo_ray.envs.contract import as_environment
from grpo_ray.envs.runner_child import load_environment_class
from grpo_ray.envs.tool_calls import parse_tool_calls
from grpo_ray.models.loading import load_tokenizer

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "configs" / "smollm2-tools.yaml"
ROW = {"prompt": "What is 221 * 722? Answer with just the number.", "answer": "159562"}


def environment():
    spec = load_config(RECIPE).environment.spec
    return as_environment(load_environment_class(spec)())


def test_the_first_messages_show_the_tool_and_a_call_the_parser_reads():
    messages = environment().reset(ROW)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert '"name": "multiply"' in messages[0]["content"] and messages[-1]["content"] == ROW["prompt"]
    [call] = parse_tool_calls(messages[2]["content"]).calls
    assert (call.name, call.arguments) == ("multiply", {"a": 312, "b": 457})
    assert messages[3]["content"] == str(312 * 457)
    # SmolLM2's chat template drops tools=: these messages are all the model learns them from.
    tokenizer = load_tokenizer("smollm2-135m")
    shown = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.apply_chat_template(messages, tools=environment().tools(), tokenize=False) == shown
    assert "<tools>" in shown and "<tool_call>" in shown


def test_the_step_rewards_pay_for_the_call():
    env = environment()
    env.reset(ROW)
    ran = env.step('<tool_call>\n{"name": "multiply", "arguments": {"a": 221, "b": 722}}\n</tool_call>')
    assert (ran.reward, ran.done, ran.messages) == (1.0, False, [{"role": "tool", "content": "159562"}])
    wrong_tool = env.step('<tool_call>\n{"name": "double", "arguments": {"a": 221}}\n</tool_call>')
    assert (wrong_tool.reward, wrong_tool.counts["tool_errors"]) == (0.25, 1)
    not_json = env.step('<tool_call>\n{"type": "function", "arguments": [221, 722]}\n</tool_call>')
    assert (not_json.reward, not_json.counts["unparsable_calls"]) == (0.25, 1)
    answer = env.step("159562")
    assert (answer.reward, answer.done) == (0.0, True)
