"""The names of the built-in models and data sets, which a recipe gives in place of a path or hub id
and which are built into the cache on first use (models/cache.py). Names only, no imports: the config
reads them to tell a built-in from a local path, and the loaders to build them."""

from __future__ import annotations

# model.path (and any other model field): the project's tiny models, and a real one from PyPI.
TINY = "tiny"
TINY_TOOLS = "tiny-tools"  # the tiny model pre-trained to call a calculator (models/tiny_tools.py)
# The tiny model after GRPO on its own task (tiny:train), a teacher for it (models/tiny_teacher.py).
TINY_TEACHER = "tiny-teacher"
SMOLLM2 = "smollm2-135m"  # SmolLM2-135M-Instruct, installed from PyPI (models/smollm2.py)
GEMMA3 = "gemma3-270m"  # Gemma 3 270M, a base model, installed from PyPI on request (models/gemma3.py)
BUILT_IN_MODELS = (TINY, TINY_TOOLS, TINY_TEACHER, SMOLLM2, GEMMA3)

# data.train_files / eval_files: "<name>:train" and "<name>:heldout", each built-in model's task.
BUILT_IN_DATA = (TINY, TINY_TOOLS, SMOLLM2, GEMMA3)
BUILT_IN_DATA_PREFIXES = tuple(f"{name}:" for name in BUILT_IN_DATA)
