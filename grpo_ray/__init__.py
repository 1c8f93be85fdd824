"""grpo-ray: GRPO post-training of language models on Ray.

    import grpo_ray
    result = grpo_ray.train("configs/tiny.yaml", {"train.steps": 20})

`train`, `validate` and `load` are grpo_ray/api.py's; the CLI (`grpo-ray train|validate`) runs the same code.
"""

__version__ = "0.1.0"
__all__ = ["Validation", "load", "train", "validate"]


def __getattr__(name: str):
    # Imported on first use: `import grpo_ray.<module>` (every actor, the CLI, which sets torch's
    # environment before torch loads) must not pull in the config and torch through this file.
    if name in __all__:
        from grpo_ray import api

        return getattr(api, name)
    raise AttributeError(f"module 'grpo_ray' has no attribute {name!r}")
