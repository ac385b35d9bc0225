"""Seals: an HMAC-SHA256 that binds a file's content to the identity it was written for, under a
secret key, so that only files this product wrote for that identity are trusted.

A shared output folder is writable by anyone who can write ``output_dir``: a file in it (a kept
result, a checkpoint, a cached evaluation) may be planted, copied from another run or edited. Each
such file carries ``seal(key, context, identity, content)``: the HMAC of a fixed context (what kind
of file), the identity it was written for (a run id, a config digest, a cache key) and its content,
each part separated by a NUL byte. Without the key nobody can make a seal that matches, so a file
that does not verify (`verify`) is ignored and its content computed again.

An ablation's key is the experiment's secret key in the ledger (`Ledger.result_key`); its workers
get `derive(key, ...)` of it, never the key itself. A direct `train` call without a key seals under
`UNKEYED`, which is public: it catches a file edited or copied by hand, not one forged on purpose.
Stdlib only.
"""

from __future__ import annotations

import hashlib
import hmac

UNKEYED = b"dapo-ablate: no experiment key (a direct train call)"
"""The key of a trainer run outside an experiment (public: it guards against mistakes only)."""


def seal(key: bytes, context: bytes, *parts: str | bytes) -> str:
    """HMAC-SHA256 (hex) under `key` of `context` followed by `parts`, NUL-separated."""
    message = context + b"\x00".join(part.encode() if isinstance(part, str) else part for part in parts)
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def verify(found: object, key: bytes, context: bytes, *parts: str | bytes) -> bool:
    """`found` is the seal of `parts` under `key` and `context` (compared in constant time)."""
    return isinstance(found, str) and hmac.compare_digest(found, seal(key, context, *parts))


def derive(key: bytes, purpose: str) -> bytes:
    """A key for one purpose, derived from `key` (a worker never holds the ledger's key itself)."""
    return hmac.new(key, b"dapo-ablate derived key\x00" + purpose.encode(), hashlib.sha256).digest()
