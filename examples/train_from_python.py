"""grpo-ray from Python: check a recipe, train it with a few overrides, read the result.

.venv/bin/python examples/train_from_python.py
"""

import grpo_ray

# The same checks as `grpo-ray validate`: models, reward functions, data, the plan on this machine.
checked = grpo_ray.validate("configs/tiny.yaml", {"train.steps": 20})
print(f"{checked.train_prompts} training prompts; the plan fits {checked.checked_on}")

# The same run as `grpo-ray train configs/tiny.yaml --set train.steps=20 ...`; a dict recipe works too.
result = grpo_ray.train(
    "configs/tiny.yaml",
    {"train.steps": 20, "train.eval_every": 0, "data.eval_limit": 100, "output_dir": "runs/from-python"},
)
print(f"held-out accuracy {result.eval_accuracy[0]:.2f} -> {result.eval_accuracy[result.steps]:.2f}")
print(f"model in {result.model_dir}; MLflow run {result.run_id} in {result.tracking_uri}")
