"""The trainer's step-boundary checkpoints, sealed: a checkpoint is resumed from only if this product
wrote it for this run.

A run folder is writable by anyone who can write ``output_dir``. A checkpoint copied from another
run with its config digest and final evaluation edited would otherwise make that run "finished"
without training. So `save_sealed` stores in the checkpoint ``seal``: the HMAC (`core.seals`) of the
run's config digest and `state_digest` of everything else in it, under the experiment's worker key
(a direct `train` call: `seals.UNKEYED`). `load_sealed` reads it (a regular file, never through a
link, with ``weights_only=True`` so no pickled code runs) and gives it back only if the seal
matches; anything else is `UntrustedCheckpoint`, saying why.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import torch

from . import seals
from .atomic import UnreadableFile, read_regular, replace_with

_CONTEXT = b"dapo-ablate checkpoint\x00"
SEAL = "seal"
"""The checkpoint entry that holds its seal."""


class UntrustedCheckpoint(ValueError):
    """A checkpoint this product did not seal for this run; the message says why (a phrase), and
    `config_digest` is the digest it claims (None where it holds none)."""

    def __init__(self, reason: str, config_digest: str | None = None) -> None:
        super().__init__(reason)
        self.config_digest = config_digest


def state_digest(state: Any) -> str:
    """sha256 (hex) of a checkpoint's content: every tensor's dtype, shape and bytes and every plain
    value, in a fixed order (mapping keys sorted), so the same state digests the same after
    `torch.save` and `torch.load`."""
    digest = hashlib.sha256()
    _feed(digest, state)
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        digest.update(f"T{value.dtype}{tuple(value.shape)}:".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        digest.update(f"D{len(value)}:".encode())
        for key in sorted(value, key=repr):
            digest.update(repr(key).encode() + b"=")
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__}{len(value)}:".encode())
        for item in value:
            _feed(digest, item)
    else:
        digest.update(f"{type(value).__name__}:{value!r};".encode())


def save_sealed(path: Path, state: dict[str, Any], key: bytes) -> None:
    """Write `state` (with its ``config_digest``) and its seal under `key`, atomically and never
    through a link (a crash mid-write leaves the previous checkpoint)."""
    sealed = {**state, SEAL: seals.seal(key, _CONTEXT, state["config_digest"], state_digest(state))}
    replace_with(path, lambda tmp: torch.save(sealed, tmp))


def load_sealed(path: Path, key: bytes) -> dict[str, Any]:
    """The checkpoint at `path` (its seal removed) if it was sealed under `key`; else
    UntrustedCheckpoint saying why."""
    try:
        data = read_regular(path)
        state = torch.load(io.BytesIO(data), weights_only=True)  # never unpickle code from a shared folder
    except UnreadableFile as why:
        raise UntrustedCheckpoint(str(why)) from None
    except Exception as err:  # noqa: BLE001 - any failure to load untrusted bytes is the same verdict
        raise UntrustedCheckpoint(f"{type(err).__name__} while loading it") from None
    if not isinstance(state, dict):
        raise UntrustedCheckpoint(f"it holds a {type(state).__name__}, not a mapping")
    if not isinstance(state.get("config_digest"), str):
        raise UntrustedCheckpoint("it holds no config digest")
    found, claimed = state.pop(SEAL, None), state["config_digest"]
    try:
        content = state_digest(state)
    except (RecursionError, RuntimeError, TypeError, ValueError):
        raise UntrustedCheckpoint("its content cannot be digested", claimed) from None
    if found is None:
        raise UntrustedCheckpoint("it carries no seal", claimed)
    if not seals.verify(found, key, _CONTEXT, claimed, content):
        raise UntrustedCheckpoint("its seal does not match its content under this experiment's key", claimed)
    return state
