"""A checkpoint's processor and config, from a local directory or a Hugging Face hub id, and errors
that say what to do when they cannot be had.

A hub id is loaded as transformers loads it: ``AutoProcessor`` and ``AutoConfig`` fetch the files
they read (``config.json``, the processor's and tokenizer's files, the chat template) into the
local Hugging Face cache, never the weights. ``HF_HUB_OFFLINE=1`` reads the cache only.
"""

from __future__ import annotations

import os
from typing import Any

from .errors import PretrainedLoadError

#: What AutoProcessor and AutoConfig read from a checkpoint (weights excluded), for ``hf download
#: ID --include ...`` on a machine with network before going offline.
HUB_FILES = ("*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken")


def load_pretrained(name_or_path: str | os.PathLike[str], *, revision: str | None = None,
                    cache_dir: str | os.PathLike[str] | None = None, token: str | bool | None = None,
                    local_files_only: bool | None = None) -> tuple[Any, Any]:
    """``(processor, config)`` of a checkpoint directory or a hub id such as
    ``"Qwen/Qwen2.5-VL-7B-Instruct"``. The keyword arguments are transformers' own; a directory
    is read without asking the hub. Raises :class:`~mmrope_core.PretrainedLoadError`."""
    from transformers import AutoConfig, AutoProcessor

    name = os.fspath(name_or_path)
    path = os.path.expanduser(name)
    local = os.path.isdir(path)
    if not local and _looks_like_a_path(name):
        raise PretrainedLoadError(
            f"there is no directory {name!r}. Pass the directory a checkpoint was saved to (save_pretrained), or "
            f"a hub id such as 'Qwen/Qwen2.5-VL-7B-Instruct'")
    given = {"revision": revision, "cache_dir": cache_dir, "token": token,
             "local_files_only": True if local else local_files_only}
    kwargs = {key: value for key, value in given.items() if value is not None}
    try:
        processor = AutoProcessor.from_pretrained(path if local else name, **kwargs)
        config = AutoConfig.from_pretrained(path if local else name, **kwargs)
    except (OSError, ValueError, ImportError) as exc:
        raise PretrainedLoadError(_advice(name, local, revision, cache_dir, exc)) from exc
    return processor, config


def _looks_like_a_path(name: str) -> bool:
    """A name no hub id has: absolute, relative to here or home, or more than ``namespace/name``."""
    return (os.path.isabs(name) or name.startswith((".", "~")) or os.sep in name.strip("/").replace("/", "", 1)
            or os.path.exists(name))


def _advice(name: str, local: bool, revision: str | None, cache_dir: str | os.PathLike[str] | None,
            exc: BaseException) -> str:
    reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
    what = f"the directory {name!r}" if local else f"the hub model {name!r}"
    if "torchvision" in str(exc):
        return (f"cannot build the processor of {what}: its video processor needs torchvision ({reason}). Install "
                f"the torchvision build that matches your torch")
    if local:
        return (f"cannot load a processor and a config from {what} ({reason}). It needs the files save_pretrained "
                f"writes: config.json and the processor's and tokenizer's files")
    causes = {type(error).__name__ for error in _chain(exc)}
    if "GatedRepoError" in causes:
        return (f"the hub model {name!r} is gated ({reason}). Accept its terms on its hub page, then log in with "
                f"`hf auth login` or pass token=")
    if "RepositoryNotFoundError" in causes:
        return (f"there is no hub model {name!r}, or it is private ({reason}). Check the id (such as "
                f"'Qwen/Qwen2.5-VL-7B-Instruct'), or log in with `hf auth login` or pass token= for a private one")
    if "RevisionNotFoundError" in causes:
        return f"the hub model {name!r} has no revision {revision!r} ({reason}); pass a branch, tag or commit it has"
    if "HFValidationError" in causes:
        return (f"{name!r} is neither a directory nor a hub id ({reason}). Pass a checkpoint directory or a hub id "
                f"such as 'Qwen/Qwen2.5-VL-7B-Instruct'")
    if causes & {"LocalEntryNotFoundError", "OfflineModeIsEnabled"} or "connect" in str(exc):
        from huggingface_hub import constants

        where = ("the hub is switched off (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE
                 else "the hub cannot be reached (set HF_HUB_OFFLINE=1 to skip the retries on a machine without it)")
        cache = os.fspath(cache_dir) if cache_dir is not None else constants.HF_HUB_CACHE
        return (f"the processor and config of the hub model {name!r} are not in the local Hugging Face cache "
                f"({cache}) and {where}. On a machine with network, fetch them without the "
                f"weights: `hf download {name} --include {' '.join(repr(pattern) for pattern in HUB_FILES)}`, copy "
                f"that cache here and set HF_HUB_OFFLINE=1; or pass the checkpoint's local directory")
    return f"cannot load a processor and a config for the hub model {name!r} ({reason})"


def _chain(exc: BaseException | None) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen
