"""`grpo-ray runs compare`: the table and its rules on hand-made runs, then the command against a
real sqlite MLflow store filled by `MlflowTracker`, with every one-line error."""

import re
from dataclasses import replace
import socket

import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from grpo_ray.cli import main
from grpo_ray.commands.runs_compare import (
    RunRecord,
    format_duration,
    format_grid,
    last_and_best,
    lower_is_better,
    plot_curves,
    plot_labels,
    split_params,
    table_lines,
    wrap_value,
)
from grpo_ray.tracking import MlflowTracker, default_tracking_uri

# ---- pure functions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["loss/total", "loss/kl", "timing/step", "sync/seconds", "reward/failed", "reward/math/failures"]
)
def test_costs_are_best_when_lowest(key):
    assert lower_is_better(key)


@pytest.mark.parametrize(
    "key", ["reward/mean", "eval/accuracy", "eval/gsm8k/avg@8", "throughput/learner_tokens_per_s", "lossy/x"]
)
def test_everything_else_is_best_when_highest(key):
    assert not lower_is_better(key)


CURVE = [(1, 0.2), (2, 0.5), (3, 0.4)]


def test_last_and_best():
    # Last is the value at the highest step, 0.4; a reward's best is the max, 0.5 at step 2; a
    # loss's the min, 0.2 at step 1.
    assert last_and_best(CURVE, "reward/mean") == (0.4, (2, 0.5))
    assert last_and_best(CURVE, "loss/total") == (0.4, (1, 0.2))
    # The best value reached twice: the first step it was reached at.
    assert last_and_best([(0, 1.0), (5, 0.5), (9, 1.0)], "eval/accuracy") == (1.0, (0, 1.0))
    assert last_and_best([], "reward/mean") is None


def test_split_params():
    runs = [
        {"model": "tiny", "train.lr": "1e-06", "train.steps": "3", "only.first": "x"},
        {"model": "tiny", "train.lr": "1e-05", "train.steps": "3"},
        {"model": "tiny", "train.lr": "1e-06", "train.steps": "3"},
    ]
    # train.lr differs in the second run; only.first is missing from two runs, which differs too.
    assert split_params(runs) == (["only.first", "train.lr"], 2)
    assert split_params([{"a": "1"}, {"a": "1"}]) == ([], 1)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0.04, "0.0s"), (5.04, "5.0s"), (59.9, "59.9s"), (65, "1m05s"), (3723.4, "1h02m03s")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_format_grid_pads_columns_and_strips_line_ends():
    assert format_grid([["", "a", "bb"], ["key", "", "c"]]) == ["     a  bb", "key     c"]


def test_format_grid_gives_a_cell_of_several_lines_a_row_as_tall():
    # "xx\nyyy" makes its row two lines, the other cells blank on the second; column 1 is 3 wide.
    assert format_grid([["k", "xx\nyyy", "z"], ["j", "w", "v"]]) == ["k  xx   z", "   yyy", "j  w    v"]


def test_wrap_value_keeps_every_character():
    # Width 10: "alpha beta gamma" breaks after its last space within columns 5-9, "alpha beta "
    # has it at index 10, out of reach, so after "alpha " (6); "beta gamma" is 10 and fits.
    assert wrap_value("alpha beta gamma", 10) == "alpha \nbeta gamma"
    # No space in a line's second half: cut at the width exactly.
    assert wrap_value("a" * 23, 10) == "a" * 10 + "\n" + "a" * 10 + "\n" + "aaa"
    # YAML's folded lines become one line first; short values are left alone.
    assert wrap_value("[x,\n    y]", 10) == "[x, y]"
    value = "[{name: math, options: {answer_field: answer, boxed_only: true, tolerance: 1.0e-06}}]" * 3
    assert "".join(wrap_value(value).split("\n")) == value
    assert all(len(line) <= 50 for line in wrap_value(value).split("\n"))


BASE = RunRecord(
    run_id="aaaaaaaa1111",
    name="base",
    status="FINISHED",
    duration_s=65.0,
    params={
        "model": "tiny",
        "train.lr": "1e-06",
        "train.steps": "3",
        "only.a": "x",
        "data.files": "[" + "a" * 60 + "]",
    },
    history={"reward/mean": CURVE, "loss/total": [(1, 0.9), (2, 0.6), (3, 0.7)]},
)
HOT = RunRecord(
    run_id="bbbbbbbb2222",
    name="hot",
    status="FAILED",
    duration_s=None,
    params={"model": "tiny", "train.lr": "1e-05", "train.steps": "3", "data.files": "[b]"},
    history={"reward/mean": [(1, 0.3), (2, 0.6), (3, 0.8)]},
)


def test_table_of_two_hand_made_runs():
    # Params: data.files, only.a (missing from hot) and train.lr differ, sorted; model and
    # train.steps are equal: 2 identical. data.files is 62 characters without a space: whole, its
    # first 50 (PARAM_WIDTH) on its row, the other 12 on a line of their own below.
    # reward/mean: base last 0.4, best (max) 0.5 at step 2; hot last 0.8, best 0.8 at step 3.
    # loss/total: base last 0.7, best (min) 0.6 at step 2; hot never logged it.
    # Column 0 is as wide as "reward/mean best (max)" (22), column 1 as data.files's first line (50).
    assert table_lines([BASE, HOT], ["reward/mean", "loss/total"]) == [
        "                        base (aaaaaaaa)                                     hot (bbbbbbbb)",
        "data.files              [" + "a" * 49 + "  [b]",
        "                        " + "a" * 11 + "]",
        "only.a                  x                                                   -",
        "train.lr                1e-06                                               1e-05",
        "reward/mean last        0.4                                                 0.8",
        "reward/mean best (max)  0.5 (step 2)                                        0.8 (step 3)",
        "loss/total last         0.7                                                 -",
        "loss/total best (min)   0.6 (step 2)                                        -",
        "status                  FINISHED                                            FAILED",
        "duration                1m05s                                               -",
        "2 params identical in all runs (not shown)",
    ]


def test_plot_labels_add_the_id_only_to_shared_names():
    twin = RunRecord("cccccccc3333", "base", "FINISHED", 1.0, {}, {})
    assert plot_labels([BASE, HOT, twin]) == ["base (aaaaaaaa)", "hot", "base (cccccccc)"]


def test_plot_of_hand_made_runs_is_a_png(tmp_path):
    # eval/accuracy was logged by neither run: its panel says so instead of failing.
    path = tmp_path / "plots" / "curves.png"
    plot_curves([BASE, HOT], str(path))
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


# ---- the command against a real sqlite store ----------------------------------------------------

BASE_METRICS = [  # per step: reward/mean, loss/total, timing/step; eval/accuracy at the last step only
    {"reward/mean": 0.2, "loss/total": 0.9, "timing/step": 2.0},
    {"reward/mean": 0.5, "loss/total": 0.6, "timing/step": 1.5},
    {"reward/mean": 0.4, "loss/total": 0.7, "timing/step": 1.75, "eval/accuracy": 0.25},
]
HOT_METRICS = [
    {"reward/mean": 0.3, "loss/total": 0.8, "timing/step": 1.0},
    {"reward/mean": 0.6, "loss/total": 0.5, "timing/step": 1.25},
    {"reward/mean": 0.8, "loss/total": 0.4, "timing/step": 1.5, "eval/accuracy": 0.5},
]


def log_run(uri, experiment, name, params, steps, status="FINISHED", stage=None):
    tracker = MlflowTracker(uri, experiment, name, None)
    tracker.log_config(params, {"unused": True})
    if stage:  # a nested run, as the driver opens for each training stage
        tracker.start_stage(stage, {"stage.max_new_tokens": 8})
    for step, metrics in enumerate(steps, start=1):
        tracker.log_metrics(step, metrics)
    tracker.finish(status)
    return tracker.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Experiment "grpo": base (with a nested stage run) and hot; experiment "solo": one run."""
    folder = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    common = {"model": "tiny", "train.steps": 3, "algorithm.clip_low": 0.2}
    base = log_run(
        uri, "grpo", "base", {**common, "train.lr": 1e-6, "rollout.temperature": 1.0}, BASE_METRICS, stage="stage1"
    )
    hot = log_run(
        uri, "grpo", "hot", {**common, "train.lr": 1e-5, "rollout.temperature": 1.2}, HOT_METRICS, status="FAILED"
    )
    log_run(uri, "solo", "alone", common, BASE_METRICS)
    return {"uri": uri, "base": base, "hot": hot, "folder": folder}


def compare(*args, env=None):
    return CliRunner().invoke(main, ["runs", "compare", *args], env={"MLFLOW_TRACKING_URI": None, **(env or {})})


def parse_table(output):
    """{row label: [cell per run]}; the header row under the label ""."""
    rows = {}
    for line in output.splitlines():
        if line.startswith(" ") or "  " in line:
            label, *cells = re.split(r" {2,}", line)
            rows[label] = cells
    return rows


def test_experiment_compares_its_top_level_runs_oldest_first(store):
    client = MlflowClient(store["uri"])
    everything = client.search_runs([client.get_experiment_by_name("grpo").experiment_id])
    assert len(everything) == 3  # base, hot, and base's nested stage run

    result = compare("--experiment", "grpo", env={"MLFLOW_TRACKING_URI": store["uri"]})
    assert result.exit_code == 0, result.output
    rows = parse_table(result.output)
    assert rows[""] == [f"base ({store['base'][:8]})", f"hot ({store['hot'][:8]})"]  # no stage1 column
    assert "stage1" not in result.output
    # Differing params only, sorted; model, train.steps, algorithm.clip_low are the 3 identical.
    params = [label for label in rows if "." in label and " " not in label]
    assert params == ["rollout.temperature", "train.lr"]
    assert rows["train.lr"] == ["1e-06", "1e-05"] and rows["rollout.temperature"] == ["1.0", "1.2"]
    assert "3 params identical in all runs (not shown)" in result.output.splitlines()
    # base: reward 0.2, 0.5, 0.4 -> last 0.4, best 0.5 at step 2; hot: 0.3, 0.6, 0.8 -> 0.8 both.
    assert rows["reward/mean last"] == ["0.4", "0.8"]
    assert rows["reward/mean best (max)"] == ["0.5 (step 2)", "0.8 (step 3)"]
    assert rows["eval/accuracy last"] == ["0.25", "0.5"]
    assert rows["eval/accuracy best (max)"] == ["0.25 (step 3)", "0.5 (step 3)"]
    # Costs: base loss 0.9, 0.6, 0.7 -> best 0.6 at step 2; timing best is the fastest step.
    assert rows["loss/total last"] == ["0.7", "0.4"]
    assert rows["loss/total best (min)"] == ["0.6 (step 2)", "0.4 (step 3)"]
    assert rows["timing/step best (min)"] == ["1.5 (step 2)", "1 (step 1)"]
    assert rows["status"] == ["FINISHED", "FAILED"]
    assert all(re.fullmatch(r"\d+\.\ds", cell) for cell in rows["duration"])


def test_run_ids_in_the_order_given_with_chosen_metrics_and_a_plot(store, tmp_path):
    plot = tmp_path / "out" / "curves.png"
    result = compare(
        store["hot"],
        store["base"],
        "--tracking-uri",
        store["uri"],
        "--metric",
        "timing/step",
        "--metric",
        "reward/mean",
        "--plot",
        str(plot),
    )
    assert result.exit_code == 0, result.output
    rows = parse_table(result.output)
    assert rows[""] == [f"hot ({store['hot'][:8]})", f"base ({store['base'][:8]})"]
    metric_rows = [label for label in rows if label.endswith(("last", "(min)", "(max)"))]
    assert metric_rows == ["timing/step last", "timing/step best (min)", "reward/mean last", "reward/mean best (max)"]
    assert rows["timing/step last"] == ["1.5", "1.75"]
    assert result.output.splitlines()[-1] == f"wrote {plot}"
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def one_line_error(result):
    assert result.exit_code == 1, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: ")
    return line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope-run-id", "{base}"], "error: unknown run id nope-run-id at "),
        (["--experiment", "missing"], "error: unknown experiment 'missing' at "),
        (["{base}"], "error: only one distinct run id given; compare needs at least two different runs"),
        (["{base}", "{base}"], "error: only one distinct run id given"),
        (["--experiment", "solo"], "error: experiment 'solo' has 1 top-level run(s); compare needs at least two"),
        (["{base}", "{hot}", "--experiment", "grpo"], "error: give either run ids or --experiment NAME"),
        ([], "error: give run folders (runs/a runs/b), run ids with --tracking-uri URI, or --experiment NAME"),
        (["{base}", "{hot}", "--plot", "curves.pdf"], "error: --plot curves.pdf: must be a .png file"),
    ],
)
def test_one_line_errors(store, args, message):
    args = [arg.format(**store) for arg in args]
    assert one_line_error(compare(*args, "--tracking-uri", store["uri"])).startswith(message)


def test_missing_tracking_uri(store):
    line = one_line_error(compare(store["base"], store["hot"]))  # MLFLOW_TRACKING_URI unset
    assert line == f"error: {store['base']}: no such folder, and run ids need --tracking-uri (or MLFLOW_TRACKING_URI)"
    line = one_line_error(compare("--experiment", "grpo"))
    assert line == "error: --tracking-uri: give the MLflow tracking URI (or set MLFLOW_TRACKING_URI)"


def test_unreachable_server():
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    line = one_line_error(compare("a", "b", "--tracking-uri", f"http://127.0.0.1:{port}"))
    assert line.startswith(f"error: tracking URI http://127.0.0.1:{port}: cannot connect")


def test_missing_sqlite_database_is_not_created(tmp_path):
    database = tmp_path / "typo" / "mlflow.db"
    line = one_line_error(compare("a", "b", "--tracking-uri", f"sqlite:///{database}"))
    assert line == f"error: tracking URI sqlite:///{database}: no MLflow database at {database}"
    assert not database.exists()


def test_a_file_that_is_no_database(tmp_path):
    (tmp_path / "notes.db").write_text("not sqlite")
    line = one_line_error(compare("a", "b", "--tracking-uri", f"sqlite:///{tmp_path / 'notes.db'}"))
    assert line.startswith(f"error: tracking URI sqlite:///{tmp_path / 'notes.db'}: ") and "not a database" in line


# ---- run folders: each read from its own <output_dir>/mlflow.db ---------------------------------

# A reward function whose options make its MLflow param long (YAML flow text, 170 characters); run
# folders a and b differ only in its last option, which a 40-character cut used to hide.
MATH = {"name": "math_verify", "weight": 1.0}
OPTIONS = {"answer_field": "answer", "boxed_only": True, "system_prompt": "Reason step by step, then answer."}
FUNCTIONS_A = (
    "[{name: math_verify, options: {answer_field: answer, boxed_only: true, system_prompt: 'Reason step by step,"
    " then answer.', tolerance: 1.0e-06}, weight: 1.0}]"
)
FUNCTIONS_B = FUNCTIONS_A.replace("1.0e-06", "0.0001")


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    """runs/a and runs/b (one run each, as `grpo-ray train` writes them), runs/again (trained twice),
    runs/empty (no mlflow.db)."""
    root = tmp_path_factory.mktemp("project") / "runs"
    common = {"model": "tiny", "train.steps": 3}
    for name, tolerance, steps in (("a", 1e-6, BASE_METRICS), ("b", 1e-4, HOT_METRICS)):
        (root / name).mkdir(parents=True)
        functions = [{**MATH, "options": {**OPTIONS, "tolerance": tolerance}}]
        log_run(default_tracking_uri(root / name), "grpo-ray", "tiny", {**common, "reward.functions": functions}, steps)
    (root / "again").mkdir()
    log_run(default_tracking_uri(root / "again"), "grpo-ray", "first", common, BASE_METRICS, stage="stage1")
    log_run(default_tracking_uri(root / "again"), "grpo-ray", "second", common, HOT_METRICS)
    (root / "empty").mkdir()
    return root


def cells_below(output, label):
    """The cells of a row whose values may wrap: each run's column, its lines joined by a space
    (values break after a space), read at the header's column offsets."""
    lines = output.splitlines()
    header = next(line for line in lines if line.startswith(" "))
    starts = [match.start() for match in re.finditer(r"(?<=  )\S", header)]
    first = next(i for i, line in enumerate(lines) if line.startswith(label + " "))
    rows = [lines[first]]
    for line in lines[first + 1 :]:
        if not line.startswith(" "):  # the next row's label
            break
        rows.append(line)
    bounds = list(zip(starts, [*starts[1:], None]))
    return [" ".join(filter(None, (row[a:b].strip() for row in rows))) for a, b in bounds]


def test_two_run_folders_side_by_side(runs_root, monkeypatch):
    [run] = MlflowClient(default_tracking_uri(runs_root / "a")).search_runs(["0", "1"])
    assert run.data.params["reward.functions"].split() == FUNCTIONS_A.split()  # MLflow's, up to YAML's line folds
    monkeypatch.chdir(runs_root.parent)
    result = compare("runs/a", "runs/b/")
    assert result.exit_code == 0, result.output
    rows = parse_table(result.output)
    # Both runs are named "tiny"; the folder row tells them apart.
    assert rows["folder"] == ["runs/a", "runs/b"]
    assert [label for label in rows if "." in label and " " not in label] == ["reward.functions"]
    # Whole, wrapped over four lines each: the one difference is at characters 150-156.
    assert cells_below(result.output, "reward.functions") == [FUNCTIONS_A, FUNCTIONS_B]
    assert all(len(line) <= 24 + 2 * (50 + 2) for line in result.output.splitlines())
    assert rows["reward/mean best (max)"] == ["0.5 (step 2)", "0.8 (step 3)"]
    assert rows["loss/total best (min)"] == ["0.6 (step 2)", "0.4 (step 3)"]
    assert rows["status"] == ["FINISHED", "FINISHED"]
    assert result.output.splitlines()[-1] == "2 params identical in all runs (not shown)"


def test_a_folder_trained_twice_gives_its_newest_run_and_says_so(runs_root, tmp_path):
    again, plot = runs_root / "again", tmp_path / "curves.png"
    result = compare(str(again), str(runs_root / "a"), "--plot", str(plot), env={"MLFLOW_TRACKING_URI": "http://x:1"})
    assert result.exit_code == 0, result.output  # the environment's tracking URI is not used
    note = result.output.splitlines()[0]
    assert note.startswith(f"{again} holds 2 runs; comparing its newest, second (")
    assert note.endswith(
        f"; all: grpo-ray runs compare --experiment grpo-ray --tracking-uri sqlite:///{again}/mlflow.db"
    )
    assert parse_table(result.output)["reward/mean last"] == ["0.8", "0.4"]  # second logged HOT_METRICS
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_folder_plot_labels_are_the_folders():
    assert plot_labels([replace(BASE, folder="runs/a"), replace(BASE, folder="runs/b")]) == ["runs/a", "runs/b"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["runs/empty", "runs/a"], "runs/empty holds no mlflow.db: not a run's output_dir; give the output_dir of a"),
        (
            ["runs", "runs/a"],
            "runs holds no mlflow.db: not a run's output_dir; the run folders in it: runs/a, runs/again",
        ),
        (["runs/typo", "runs/a"], "runs/typo: no such folder; give a run's output_dir (the folder holding mlflow.db)"),
        (["runs/a", "3f2a9c1e"], "runs/a is a run folder but 3f2a9c1e is not: give run folders (runs/a runs/b), run"),
        (["runs/a", "runs/a/"], "only one distinct run folder given; compare needs at least two different runs"),
        (["runs/a", "runs/b", "--tracking-uri", "sqlite:///x.db"], "--tracking-uri: not with run folders, each read"),
        (["runs/a", "runs/b", "--experiment", "grpo-ray"], "--experiment: not with run folders, each read from its"),
        ([], "give run folders (runs/a runs/b), run ids with --tracking-uri URI, or --experiment NAME with"),
    ],
)
def test_run_folder_errors(runs_root, monkeypatch, args, message):
    monkeypatch.chdir(runs_root.parent)
    assert one_line_error(compare(*args)).startswith(f"error: {message}")


def test_a_store_without_runs(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        MlflowClient(default_tracking_uri(tmp_path / name)).search_experiments()  # creates the tables only
    line = one_line_error(compare(str(tmp_path / "a"), str(tmp_path / "b")))
    assert line == f"error: {tmp_path / 'a'}/mlflow.db holds no run yet; give the output_dir of a run that started"
