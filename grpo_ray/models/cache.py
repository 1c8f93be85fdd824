"""The cache of built-in models and data (tiny, tiny-tools, tiny-teacher, smollm2-135m): each built
once into a folder of its own under $GRPO_RAY_CACHE (else ~/.cache/grpo-ray), then found at once."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

# Written last: a folder without it was left by an interrupted build and is built again.
MARKER_FILE = "READY"


def default_cache_dir() -> Path:
    """$GRPO_RAY_CACHE, else ~/.cache/grpo-ray."""
    return Path(os.environ.get("GRPO_RAY_CACHE") or Path.home() / ".cache" / "grpo-ray")


def build_once(cache_dir: Path, name: str, build: Callable[[Path], None]) -> Path:
    """<cache_dir>/<name>, built by `build(folder)` unless it is there already.

    The build fills a temporary sibling folder that is renamed into place, under an exclusive lock
    on <name>.lock: concurrent callers (a run's actors, test workers) wait for the first one and
    reuse its result, and a build that fails or is killed leaves no folder behind."""
    final = cache_dir / name
    if (final / MARKER_FILE).exists():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / MARKER_FILE).exists():  # another process built it while we waited
            return final
        if final.exists():  # left by an interrupted copy or a hand edit: not trustworthy
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache_dir))
        try:
            build(tmp)
            (tmp / MARKER_FILE).write_text("ok\n")
            tmp.chmod(0o755)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
