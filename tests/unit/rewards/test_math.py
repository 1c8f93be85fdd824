r"""math_reward and last_boxed_answer: hand examples, then every row of the shared benchmarks."""

import doctest
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import math_verify
import pytest

import grpo_ray.rewards.math as math_module
from grpo_ray.rewards import last_boxed_answer, math_reward

# tests/unit/rewards/test_math.py -> parents[3] is the repo (/work/main); shared sits beside it.
SHARED_DIR = Path(__file__).resolve().parents[3] / ".." / "shared"
MATH_EVAL_DIR = SHARED_DIR / "data" / "math-eval"


def score(completion: str, gold: str, **options) -> float | None:
    return math_reward([completion], ["a prompt"], [gold], **options)[0]


# ---- last_boxed_answer ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),  # nested braces are matched, not cut at "}"
        (r"\boxed{1} at first, finally \boxed{2}", "2"),  # two boxes: the last is the answer
        ("no box at all", None),
        (r"\boxed 5", "5"),  # brace-less form
        (r"$\boxed 5$.", "5"),  # ... cut at the closing "$"
        (r"\boxed 5.", "5"),  # ... without trailing punctuation
        (r"\fbox{7}", "7"),
        (r"\boxed {42}", "42"),  # space before the brace is legal LaTeX
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces do not count as grouping
        (r"\boxed{a_{b_{c}}} tail", "a_{b_{c}}"),
        (r"\boxed{3} then cut off \boxed{\frac{1}{", None),  # last box never closed: truncated
        (r"\boxedanswer{3}", None),  # a different macro, not \boxed
        (r"\boxed{}", ""),
        ("ends with \\boxed", None),
    ],
)
def test_last_boxed_answer(text, expected):
    assert last_boxed_answer(text) == expected


# ---- math_reward: equivalences -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1.0),
        (r"\boxed{25}", "025", 1.0),  # AIME golds are zero-padded
        (r"\boxed{142}", "142.0", 1.0),  # AMC golds are stored as floats
        (r"\boxed{336}", r"336^\circ", 1.0),
        (r"\boxed{82}", r"$82$", 1.0),  # gold already delimited: used as given
        (r"\boxed{82}", r"\boxed{82}", 1.0),
        (r"\boxed{83}", "82", 0.0),
        (r"\boxed{1/3}", "0.5", 0.0),
        (r"\boxed{}", "82", 0.0),  # empty box: no answer
        ("the answer is 82", "82", 0.0),  # unboxed is not accepted by default
        (r"\boxed{82} no wait \boxed{81}", "82", 0.0),  # the last box counts
    ],
)
def test_math_reward_equivalences(completion, gold, expected):
    assert score(completion, gold) == expected


def test_scores_are_floats_one_per_completion_and_row_fields_ignored():
    scores = math_reward(
        [r"\boxed{4}", r"\boxed{5}", "nothing"],
        ["2+2?", "2+2?", "2+2?"],
        ["4", "4", "4"],
        data_source=["x", "x", "x"],
        level=[1, 1, 1],
    )
    assert scores == [1.0, 0.0, 0.0]
    assert all(type(s) is float for s in scores)


# ---- math_reward: thinking ---------------------------------------------------------------------


def test_only_text_after_the_last_think_close_is_read():
    # The box inside the thinking is a draft; after </think> there is no box, so no answer.
    assert score(r"<think>maybe \boxed{4}</think> I am not sure.", "4") == 0.0
    assert score(r"<think>\boxed{3}</think> so \boxed{4}", "4") == 1.0
    assert score(r"<think>a</think><think>b \boxed{4}</think>\boxed{5}", "5") == 1.0


def test_require_think_close():
    unclosed = r"<think>long reasoning, then \boxed{4}"
    closed = r"<think>reasoning</think> \boxed{4}"
    # Default: an unclosed think is read whole, so its box counts.
    assert score(unclosed, "4") == 1.0
    # required: a completion that never closed its reasoning scores 0 even if the box is right.
    assert score(unclosed, "4", require_think_close=True) == 0.0
    assert score(closed, "4", require_think_close=True) == 1.0
    assert score(r"\boxed{4}", "4", require_think_close=True) == 0.0


# ---- math_reward: unboxed answers --------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("Adding them up.\nThe answer is 82.", 1.0),
        ("First 80, then 2.\nSo we get $82$", 1.0),
        ("It is 82.\nActually it is 81.", 0.0),  # the last line is the answer
        ("82 is close, but\nno numbers here", 0.0),
        ("", 0.0),
    ],
)
def test_accept_unboxed_reads_the_last_line(completion, expected):
    assert score(completion, "82", accept_unboxed=True) == expected


def test_a_box_wins_over_the_last_line_when_unboxed_is_accepted():
    assert score("\\boxed{82}\nthough 81 came up", "82", accept_unboxed=True) == 1.0


# ---- math_reward: "could not score" ------------------------------------------------------------


@pytest.mark.parametrize("gold", ["", "$$", r"\text{}"])
def test_unparseable_gold_scores_none(gold):
    # The gold is broken, not the completion: None (a failure), never a 0 that would train on it.
    assert score(r"\boxed{5}", gold) is None


def test_math_verify_exception_scores_none_for_that_completion_only(monkeypatch):
    real_verify = math_verify.verify

    def flaky_verify(gold, predicted, **kwargs):
        if any(str(p) == "666" for p in predicted):
            raise RuntimeError("sympy blew up")
        return real_verify(gold, predicted, **kwargs)

    monkeypatch.setattr(math_verify, "verify", flaky_verify)
    scores = math_reward([r"\boxed{4}", r"\boxed{666}", r"\boxed{5}"], [""] * 3, ["4"] * 3)
    assert scores == [1.0, None, 0.0]


def test_runs_off_the_main_thread():
    # math-verify's timeouts use signal.alarm, which raises off the main thread; they must be off.
    with ThreadPoolExecutor(max_workers=1) as pool:
        scores = pool.submit(math_reward, [r"\boxed{0.5}"], [""], [r"\frac{1}{2}"]).result()
    assert scores == [1.0]


def test_docstring_examples_run():
    assert doctest.testmod(math_module).failed == 0


# ---- every row of the shared benchmarks --------------------------------------------------------


def _wrong_answer(gold: str) -> str:
    """A different answer: the gold's first integer plus one ("025" -> "26", "-4.0" -> "-5.0")."""
    wrong = re.sub(r"\d+", lambda m: str(int(m.group()) + 1), gold, count=1)
    assert wrong != gold, f"gold {gold!r} has no number to change"
    return wrong


@pytest.mark.parametrize("benchmark", ["aime24", "aime25", "amc23"])
def test_every_benchmark_gold_scores_right_and_a_changed_answer_scores_wrong(benchmark):
    path = MATH_EVAL_DIR / f"{benchmark}.parquet"
    if not path.is_file():
        pytest.skip(f"{path.resolve()} missing: the shared math-eval data is not on this machine")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = pq.read_table(path, columns=["prompt", "reward_model"]).to_pylist()
    assert rows, f"{path} has no rows"

    # verl-style rows: reward_model.ground_truth is a string (AIME) or a float (AMC23: 142.0).
    golds = [str(row["reward_model"]["ground_truth"]) for row in rows]
    prompts = [row["prompt"][-1]["content"] for row in rows]
    right = [f"Some working... so the answer is \\boxed{{{gold}}}" for gold in golds]
    appended = [f"Some working... so the answer is \\boxed{{{gold}1}}" for gold in golds]
    changed = [f"Some working... so the answer is \\boxed{{{_wrong_answer(g)}}}" for g in golds]

    start = time.perf_counter()
    right_scores = math_reward(right, prompts, golds)
    appended_scores = math_reward(appended, prompts, golds)
    changed_scores = math_reward(changed, prompts, golds)
    elapsed = time.perf_counter() - start

    failures = [
        f"row {i} gold {gold!r}: right={r} appended={a} changed={c}"
        for i, (gold, r, a, c) in enumerate(zip(golds, right_scores, appended_scores, changed_scores, strict=True))
        if (r, a, c) != (1.0, 0.0, 0.0)
    ]
    assert not failures, f"{benchmark}: " + "; ".join(failures)
    print(f"{benchmark}: {len(rows)} rows x 3 completions scored in {elapsed:.2f}s")
