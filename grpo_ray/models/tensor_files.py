"""Tensor files of checkpoints: written so that a full disk says so, read with weights_only.

The learners write their DeepSpeed state and the reference its weights through these; the run's
checkpoint folders (training/checkpoint.py) hold them. torch.load runs with weights_only=True and an
allowlist of the plain classes DeepSpeed's ZeRO optimizer state names: a pickle that would run
code is refused.
"""

from __future__ import annotations

import os
from typing import Any


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; one line that names the folder and what to do."""


def os_error(err: BaseException) -> OSError | None:
    """The OSError behind an exception, also when Ray wrapped it on its way from an actor."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError) and err.errno is not None:
            return err
        err = getattr(err, "cause", None) or err.__cause__
        seen += 1
    return None


# DeepSpeed's ZeRO optimizer state names these plain classes; nothing else may be unpickled.
SAFE_DEEPSPEED_GLOBALS = (
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
)


def safe_globals() -> list[Any]:
    import importlib

    found = []
    for name in SAFE_DEEPSPEED_GLOBALS:
        module, _, attr = name.rpartition(".")
        try:
            found.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):  # another DeepSpeed version: the load says what is missing
            continue
    return found


def save_tensors(value: Any, path: str | os.PathLike[str]) -> None:
    """torch.save in the legacy format, written through Python's file object: a full disk then
    raises OSError(ENOSPC), where the zip writer raises a RuntimeError that does not say why.
    DeepSpeed's checkpoint engine writes this format too."""
    import torch

    with open(path, "wb") as out:
        torch.save(value, out, _use_new_zipfile_serialization=False)


def load_tensors(path: str | os.PathLike[str], map_location: Any = None) -> Any:
    """torch.load with weights_only=True (tensors, containers, numbers and the allowlist above)."""
    import torch

    try:
        with torch.serialization.safe_globals(safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        if os_error(err) is not None:
            raise
        reason = str(err).splitlines()
        detail = next((line.strip() for line in reason if "Unsupported global" in line), reason[0] if reason else "")
        raise CheckpointError(f"{path} holds more than tensors and plain data, refused ({detail})") from None
