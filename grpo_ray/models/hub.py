"""Does a model source resolve, checked at once: a local folder exists, a hub id is in this machine's
Hugging Face cache or answers on the hub in one short request.

transformers' own loading retries an unreachable hub for about a minute before it fails with a
long message; a run asks here first, so an offline machine hears in one line which id is missing
and what to do.
"""

from __future__ import annotations

import os
from pathlib import Path

from grpo_ray.errors import first_line, missing_path_hint
from grpo_ray.models.loading import BUILT_IN_MODELS, ModelLoadError

HUB_TIMEOUT_S = 10.0


def looks_like_hub_id(source: str) -> bool:
    """ "org/name" that is not a local path (config/paths.py made every local path absolute)."""
    return source not in BUILT_IN_MODELS and source.count("/") == 1 and not source.startswith((".", "/", "~"))


def check_model_source(source: str, field: str) -> None:
    """ModelLoadError (one line naming `field`) unless `source` can be loaded from here."""
    if source in BUILT_IN_MODELS:
        return
    if not looks_like_hub_id(source):
        path = Path(source).expanduser()
        if not path.exists():
            raise ModelLoadError(
                f"{field}: {source} does not exist {missing_path_hint(field)}; give a model folder, "
                "a hub id (org/name) or 'tiny'"
            )
        if path.is_dir() and not (path / "config.json").exists() and not (path / "tokenizer_config.json").exists():
            raise ModelLoadError(
                f"{field}: {source} holds neither config.json nor tokenizer_config.json; give the "
                "folder save_pretrained wrote"
            )
        return
    check_hub_id(source, field)


def check_hub_id(repo_id: str, field: str) -> None:
    from huggingface_hub import try_to_load_from_cache

    cached = any(
        isinstance(try_to_load_from_cache(repo_id, name), str) for name in ("config.json", "tokenizer_config.json")
    )
    if not cached:
        check_hub_answers(repo_id, field, "model", ModelLoadError, "give a local folder")


def check_hub_answers(repo_id: str, field: str, repo_type: str, error: type[Exception], instead: str) -> None:
    """`error` (one line naming `field`, ending with `instead`) unless the hub answers for the model or
    dataset `repo_id` in one short request; for one not in this machine's cache (the caller asked)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    download = "hf download" + (f" --repo-type {repo_type}" if repo_type != "model" else "")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):  # read now: tests and users set it late
        raise error(
            f"{field}: {repo_id} is not in this machine's Hugging Face cache and HF_HUB_OFFLINE is "
            f"set; download it first ({download} {repo_id}) or {instead}"
        )
    try:
        HfApi().repo_info(repo_id, repo_type=repo_type, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise error(
            f"{field}: {repo_id} is gated on the Hugging Face hub; accept its terms there and log "
            f"in (hf auth login), or {instead}"
        ) from None
    except RepositoryNotFoundError:
        raise error(
            f"{field}: no {repo_type} {repo_id} on the Hugging Face hub (a private one needs hf auth "
            f"login); check the id, or {instead}"
        ) from None
    except Exception as err:  # noqa: BLE001 - no route, DNS, proxy, TLS, timeout: all mean "not reachable"
        raise error(
            f"{field}: {repo_id} is a hub id, but the Hugging Face hub cannot be reached from here "
            f"({first_line(err)}) and it is not in the local cache; download it where the hub is "
            f"reachable ({download}) or {instead}"
        ) from None
