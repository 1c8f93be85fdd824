"""transformers' generation code, imported once per process with scikit-learn hidden from it.

transformers imports scikit-learn wherever it is installed (MLflow installs it) for one function of
assisted generation (`roc_curve`, an assistant model's confidence threshold), and its tokenizer and
model Auto classes import that generation code: 0.6 s on an idle core, 1.2 s while the actors start
beside each other, in the driver and in every learner, rollout, reference and teacher process, for
code grpo-ray never runs. `without_sklearn()` imports it with `sklearn` marked absent, then lifts
the mark: a later `import sklearn` (a user's reward code) works as usual.
"""

from __future__ import annotations

import sys

GENERATION = "transformers.generation.candidate_generator"


def without_sklearn() -> None:
    """Import transformers' generation code now, without scikit-learn (once per process)."""
    if GENERATION in sys.modules or "sklearn" in sys.modules:
        return  # already imported (with or without it): nothing to save
    sys.modules["sklearn"] = None  # importlib then finds no such package, and transformers skips it
    try:
        __import__(GENERATION)
    finally:
        if sys.modules.get("sklearn", 0) is None:
            del sys.modules["sklearn"]
