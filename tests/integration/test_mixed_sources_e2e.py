"""`grpo-ray train` end to end with rows that name their own reward and a reference model other
than the policy: per-source metrics reach MLflow, and the KL is measured against the other model."""

import json

from mlflow.tracking import MlflowClient

from grpo_ray.data.loaders import load_rows
from grpo_ray.training.loop import train
from grpo_ray.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_tokenizer

from .test_train_e2e import metric_history, quick_cfg


def write_mixed(path, rows: int = 64):
    """The tiny model's addition prompts, alternately tagged "sum" and "fmt"."""
    train_rows, _ = load_rows("tiny:train")
    with path.open("w") as out:
        for i, row in enumerate(train_rows[:rows]):
            out.write(
                json.dumps({"prompt": row.prompt, "answer": row.answer, "data_source": ["sum", "fmt"][i % 2]}) + "\n"
            )
    return path


def test_by_source_metrics_and_another_reference_model(tmp_path):
    data = write_mixed(tmp_path / "mixed.jsonl")
    reference = tmp_path / "reference"
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(len(tokenizer), seed=7).save_pretrained(reference)  # same tokenizer, other weights
    save_tiny_tokenizer(tokenizer, reference)
    result = train(
        quick_cfg(
            tmp_path / "run",
            "train.steps=2",
            "train.prompts_per_step=8",
            f"data.train_files=[{data}]",
            f"data.eval_files=[{data}]",
            "data.eval_limit=16",
            "algorithm.kl_coef=0.05",
            f"reference.model_path={reference}",
            "reward.by_source={sum: [{name: exact_match}], fmt: [{name: format, options: {pattern: '[0-9]+'}}]}",
        )
    )
    for key in ("reward/source/sum/mean", "reward/source/fmt/mean", "reward/accuracy/sum/mean"):
        assert len(metric_history(result, key)) == 2, key
    assert set(metric_history(result, "eval/accuracy/sum")) == {0, 2}
    assert set(metric_history(result, "eval/accuracy/fmt")) == {0, 2}
    # Before any update the policy is the initial model: with the default reference the first
    # step's KL would be 0. Against seed 7's random weights it is far from it.
    kl = metric_history(result, "actor/kl")
    assert kl[1] > 0.1, kl
    params = MlflowClient(result.tracking_uri).get_run(result.run_id).data.params
    assert params["reference.model_path"] == str(reference)
    assert any(name.startswith("reward.by_source.") for name in params)
