"""transformers' generation code is imported without scikit-learn, which stays importable after."""

import subprocess
import sys

# A fresh interpreter: this one may hold transformers (and scikit-learn) already.
PROBE = """
import sys
from grpo_ray.models.loading import load_causal_lm, load_tokenizer
from grpo_ray.models.tiny import ensure_tiny_artifacts

path = str(ensure_tiny_artifacts().model_dir)
load_tokenizer(path)
load_causal_lm(path)
print("transformers.generation.candidate_generator" in sys.modules, "sklearn" in sys.modules)
import sklearn.metrics
print(sklearn.metrics.roc_curve.__name__)
"""


def test_a_tokenizer_and_a_model_load_without_importing_sklearn_which_imports_after():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False", "roc_curve"]
