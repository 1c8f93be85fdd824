"""A learning rate far too high for the real model is said on the console at the first update (issue 61).

SmolLM2-135M-Instruct (models/smollm2.py), its recipe shrunk to one step of 2 prompts x 8 samples with
no evaluation and no probe: at learner.lr 3e-4 (30x the recipe's tuned 1e-5) the one update moved the
sampled tokens' log-probs by 2.06 nats on average (update/moved; 11x the 0.18 the clip allows), after
which every completion was the same and the run learnt nothing more. The same step at 1e-5 moves
them 0.11 and says nothing: test_real_model.py's runs at 2e-5 (0.23) check that no line appears.
It runs in scripts/check_newest.sh and by hand (~1 min), not in CI, where the rule that says it is
tested on hand-worked figures (tests/unit/training/test_far_moves.py).
"""

from pathlib import Path

from mlflow.tracking import MlflowClient

from .conftest import train_recipe

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "smollm2-arithmetic.yaml"
# A length reward beside the accuracy, so that the step's groups hold rewards that differ (the model
# is right 8% of the time: with gsm8k alone the one step could hold nothing to learn).
ONE_STEP = [
    "train.steps=1",
    "train.prompts_per_step=2",
    "rollout.samples_per_prompt=8",
    "learner.micro_batch_size=16",
    "train.eval_every=0",
    "data.eval_files=[]",
    "data.val_fraction=0",
    "train.checkpoint_every=0",
    "weight_sync.probe_every=0",
    "reward.functions=[{name: gsm8k}, {name: length_words, weight: 0.1, options: {target_words: 6}}]",
]


def test_a_learning_rate_far_too_high_is_named_on_the_console_with_what_to_do(tmp_path):
    out = tmp_path / "far"
    console = train_recipe(RECIPE, [f"output_dir={out}", *ONE_STEP, "learner.lr=3e-4"], timeout=600)
    said = [line for line in console.splitlines() if line.startswith("warning: step 1: the update moved")]
    assert len(said) == 1, console[-4000:]
    assert "learner.lr 0.0003" in said[0] and "lower it" in said[0], said[0]
    # The figure the line gives is the step's metric in MLflow.
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("grpo-ray").experiment_id])
    moved = run.data.metrics["update/moved"]
    assert moved > 1.0 and f"{moved:.2f} nats" in said[0], (moved, said[0])
