"""One rule for relative paths (config/paths.py): a recipe's against its folder, --set's against the
working directory; hub ids, built-ins, URIs and "tiny" untouched."""

import os
from pathlib import Path

from grpo_ray.config import load_config
from grpo_ray.config.paths import anchor_paths, relative_paths

RECIPE = """
output_dir: runs/a
model: {path: ./models/policy, tokenizer: Qwen/Qwen2.5-0.5B}
data: {train_files: [data/train.jsonl, tiny:train, org/dataset], eval_files: [../shared/eval.parquet]}
reward:
  functions: [{name: rewards/mine.py:score}, {name: math}, {name: my_package.rewards:score}]
  by_source: {gsm8k: [{name: ./gsm.py:score}]}
  model: {path: ./rm}
reference: {model_path: tiny}
algorithm: {kl_coef: 0.01}
tracking: {tracking_uri: sqlite:///runs/store.db}
distillation:
  teachers: [{name: big, model_path: ./teacher, tokenizer: Qwen/Qwen2.5-7B}, {name: t, model_path: tiny, sources: [a]}]
"""


def write(tmp_path: Path) -> Path:
    folder = tmp_path / "project" / "recipes"
    folder.mkdir(parents=True)
    recipe = folder / "r.yaml"
    recipe.write_text(RECIPE)
    return recipe


def test_a_recipes_paths_are_relative_to_its_folder_from_any_working_directory(tmp_path, monkeypatch):
    recipe = write(tmp_path)
    here = recipe.parent
    monkeypatch.chdir(tmp_path)  # anywhere else
    cfg = load_config(recipe)
    assert cfg.output_dir == str(here / "runs/a")
    assert (cfg.model.path, cfg.model.tokenizer) == (str(here / "models/policy"), "Qwen/Qwen2.5-0.5B")
    assert cfg.data.train_files == (str(here / "data/train.jsonl"), "tiny:train", "org/dataset")
    assert cfg.data.eval_files == (str(tmp_path / "project/shared/eval.parquet"),)  # ".." folded
    names = [f.name for f in cfg.reward.functions]
    assert names == [f"{here}/rewards/mine.py:score", "math", "my_package.rewards:score"]
    assert cfg.reward.by_source["gsm8k"][0].name == f"{here}/gsm.py:score"
    assert cfg.reward.model.path == str(here / "rm")
    assert cfg.reference.model_path == "tiny"
    assert cfg.tracking.tracking_uri == f"sqlite:///{here}/runs/store.db"
    big, small = cfg.distillation.teachers
    assert (big.model_path, big.tokenizer, small.model_path) == (str(here / "teacher"), "Qwen/Qwen2.5-7B", "tiny")


def test_set_values_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    recipe = write(tmp_path)
    monkeypatch.chdir(tmp_path)
    cfg = load_config(recipe, ["output_dir=out", "data.train_files=[mine.jsonl]", "model.path=/abs/model"])
    assert cfg.output_dir == str(tmp_path / "out")
    assert cfg.data.train_files == (str(tmp_path / "mine.jsonl"),)
    assert cfg.model.path == "/abs/model"


def test_a_local_folder_named_like_a_hub_id_is_local(tmp_path):
    (tmp_path / "org" / "model").mkdir(parents=True)
    raw = {"model": {"path": "org/model"}, "reference": {"model_path": "org/other"}}
    anchored = anchor_paths(raw, tmp_path)
    assert anchored["model"]["path"] == str(tmp_path / "org/model")
    assert anchored["reference"]["model_path"] == "org/other"
    assert raw["model"]["path"] == "org/model", "the caller's dict is left as it was"


def test_the_fingerprint_view_writes_paths_under_the_start_relative(tmp_path):
    recipe = write(tmp_path)
    cfg = load_config(recipe)
    raw = cfg.model_dump(mode="json")
    shown = relative_paths(raw, recipe.parent)
    assert shown["output_dir"] == "runs/a" and shown["data"]["train_files"][0] == "data/train.jsonl"
    assert shown["reward"]["functions"][0]["name"] == "rewards/mine.py:score"
    assert shown["tracking"]["tracking_uri"] == "sqlite:///runs/store.db"
    outside = relative_paths(raw, recipe.parent / "elsewhere")
    assert outside["output_dir"] == raw["output_dir"], "a path outside the start stays absolute"


def test_the_repositorys_tiny_recipe_writes_to_the_repositorys_runs_folder():
    repo = Path(__file__).resolve().parents[3]
    cfg = load_config(repo / "configs" / "tiny.yaml")
    assert cfg.output_dir == os.path.join(repo, "runs", "tiny")
