"""A finished run's result kept on disk until the ledger holds it, sealed so that only a result this
product kept for that run is ever recorded.

The driver keeps a result in the run's folder (``<run folder>/finished-result.json``) before it
writes the ledger, so that a driver stopped in between (Ctrl-C, a database that stays down) never
has the run trained again: the next invocation records the kept result instead (`record_kept`).
A run folder is writable by anyone who can write ``output_dir``, so the file is sealed: an
HMAC-SHA256 over the run id and the result's canonical JSON (sorted keys, no spaces), under the
experiment's secret key (`Ledger.result_key`: created once, stored in the ledger; the driver reads
it at start, while the database is up, and holds it in memory, so a result kept during a database
outage is sealed too). A kept file is recorded only if it is a regular file (not a link, a FIFO or
a device) of at most `MAX_KEPT_BYTES`, its seal matches this run under this experiment's key, and
its result passes the ledger's check (`RunRecord` and `ledger_values.result_values`). Anything
else (planted, copied from another run or experiment, edited, truncated) is set aside, renamed to
`SET_ASIDE` beside it with a one-line note, and the run trains again; nothing a file points to is
read or written.

The key is as secret as the ledger: someone who can read the ledger's database can seal results.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import Ledger
from dapo_ablate.ablation.store.ledger_values import result_values
from dapo_ablate.ablation.store.transient import Retrying
from dapo_ablate.core import seals
from dapo_ablate.core.atomic import UnreadableFile, own_folder, read_regular
from dapo_ablate.core.contracts import RunRecord

KEPT_RESULT = "finished-result.json"
"""A finished run's sealed result, in its run folder, until the ledger holds it."""
SET_ASIDE = "finished-result.set-aside.json"
"""What a kept result that is not trusted is renamed to (the last one set aside)."""
FORMAT = 1
MAX_KEPT_BYTES = 256 * 2**20
"""A kept result larger than this is not read (a result with every step's signals is megabytes)."""
_CONTEXT = b"dapo-ablate kept result\x00"


class UntrustedResult(ValueError):
    """A kept result this product did not write for this run; the message says why (a phrase)."""


def canonical(result: dict[str, Any]) -> str:
    """The result's canonical JSON: sorted keys, no spaces (what the seal covers)."""
    return json.dumps(result, sort_keys=True, separators=(",", ":"))


def seal(key: bytes, run_id: str, result: dict[str, Any]) -> str:
    """HMAC-SHA256 (hex) of `result` kept for `run_id` under the experiment's `key` (`core.seals`)."""
    return seals.seal(key, _CONTEXT, run_id, canonical(result))


@dataclass(frozen=True)
class ResultKeeper:
    """The sealed results of one experiment's run folders (under `run_root`), with its `key`."""

    run_root: Path
    key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.key) < 16:
            raise ValueError("a result key needs at least 16 bytes (Ledger.result_key)")

    def path(self, run_id: str) -> Path:
        return self.run_root / run_id / KEPT_RESULT

    def keep(self, run_id: str, result: dict[str, Any]) -> bool:
        """Write `result`, sealed, to the run's folder (a temporary file created there, then renamed
        over `KEPT_RESULT`: never written through a link). A result the ledger would refuse (JSON
        cannot hold it, unknown keys, metrics that are not numbers) is not kept: False."""
        try:
            plain = json.loads(json.dumps(result, default=_plain))  # keys as strings, scalars as numbers
            result_values(plain)
            document = {"format": FORMAT, "run_id": run_id, "hmac": seal(self.key, run_id, plain), "result": plain}
            text = json.dumps(document)
        except (TypeError, ValueError):
            return False
        folder = own_folder(self.path(run_id).parent)  # a link planted as the run's folder is replaced
        handle, temporary = tempfile.mkstemp(prefix=".finished-result.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(handle, "w") as out:
                out.write(text)
            os.replace(temporary, self.path(run_id))
        except IsADirectoryError:  # a folder planted at its name: the ledger write goes on without a copy
            Path(temporary).unlink(missing_ok=True)
            return False
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return True

    def exists(self, run_id: str) -> bool:
        """Something is at the kept result's name (a file, a link, anything)."""
        return os.path.lexists(self.path(run_id))

    def load(self, run_id: str) -> dict[str, Any]:
        """The kept result of `run_id`, if this product sealed it for that run under this key and
        the ledger can hold it; else UntrustedResult saying why."""
        document = _parse(_read_regular(self.path(run_id)))
        if document.get("format") != FORMAT or not isinstance(document.get("result"), dict):
            raise UntrustedResult("it is not a sealed result")
        if not seals.verify(document.get("hmac"), self.key, _CONTEXT, run_id, canonical(document["result"])):
            raise UntrustedResult("its seal does not match this run of this experiment")
        result = document["result"]
        try:
            RunRecord.from_dict(result)
            result_values(result)
        except (TypeError, ValueError) as err:
            raise UntrustedResult(f"it is not a run result ({err})") from None
        return result

    def set_aside(self, run_id: str, reason: str, name: str) -> str:
        """Rename the run's kept result to `SET_ASIDE` (a link is renamed, not followed); the note."""
        try:
            os.replace(self.path(run_id), self.path(run_id).with_name(SET_ASIDE))
            where = f"set aside as {SET_ASIDE}"
        except OSError as err:  # e.g. a folder at both names, or a read-only run folder
            where = f"left where it is ({err.strerror}), not recorded"
        return f"{name}: its kept result is not one dapo-ablate wrote for it ({reason}); {where}, the run trains again"

    def drop(self, run_id: str) -> None:
        self.path(run_id).unlink(missing_ok=True)


def _read_regular(path: Path) -> str:
    """The text of a regular file of at most MAX_KEPT_BYTES, opened without following a link and
    without blocking on a FIFO (`atomic.read_regular`); UntrustedResult otherwise."""
    try:
        data = read_regular(path, MAX_KEPT_BYTES)
    except UnreadableFile as why:
        raise UntrustedResult(str(why)) from None
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise UntrustedResult("it is not UTF-8 text") from None


def _parse(text: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):  # json's errors, over-long integers, nesting too deep
        raise UntrustedResult("it is not JSON") from None
    if not isinstance(document, dict):
        raise UntrustedResult("it is not a sealed result")
    return document


def _plain(value: Any) -> Any:
    """json.dumps fallback for numpy / torch scalars in a result."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot keep a {type(value).__name__} in a run result")


def record_result(ledger: Ledger, keeper: ResultKeeper, run_id: str, result: dict[str, Any], name: str) -> bool:
    """Keep the result on disk (if it is not kept yet), then write it to the ledger, retrying
    transient database errors; the file goes once the ledger holds the result. If the database
    stays down the driver stops with a sentence about the database, and the next invocation
    records the kept result (`record_kept`) instead of training the run again. A result the
    ledger cannot hold (ValueError / TypeError) drops its file and raises. False if another
    driver had finished the run."""
    if not keeper.exists(run_id):
        keeper.keep(run_id, result)
    try:
        recorded = Retrying(ledger).finish(run_id, result, doing=f"record {name}", kept=keeper.path(run_id))
    except ExecutorError:  # the database stays down: the kept result is for the next invocation
        raise
    except (ValueError, TypeError):
        keeper.drop(run_id)  # retraining gives it again; a kept copy would block every rerun
        raise
    keeper.drop(run_id)
    return recorded


@dataclass
class KeptRecords:
    """What `record_kept` did: the runs recorded, and one note per kept result set aside."""

    recorded: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def record_kept(ledger: Ledger, keeper: ResultKeeper, run_ids: list[str], names: Callable[[str], str] = str,
                host: str | None = None) -> KeptRecords:
    """Record the results kept on disk by a driver whose ledger write failed (or that died between
    the two writes). `run_ids`: the runs that are not done in the ledger. A kept result this
    product did not seal for its run is set aside (the run trains); one it sealed that the ledger
    cannot hold fails its run (with `host`) and its file goes."""
    done = KeptRecords()
    for run_id in run_ids:
        if not keeper.exists(run_id):
            continue
        try:
            result = keeper.load(run_id)
        except UntrustedResult as why:
            done.notes.append(keeper.set_aside(run_id, str(why), names(run_id)))
            continue
        try:
            Retrying(ledger).finish(run_id, result, doing=f"record {names(run_id)}", kept=keeper.path(run_id))
        except ExecutorError:  # the database is down again: the file stays for the next invocation
            raise
        except (ValueError, TypeError) as err:
            error = f"the run finished but its kept result cannot be stored: {type(err).__name__}: {err}"[:2000]
            Retrying(ledger).fail(run_id, error, host, doing=f"record the failure of {names(run_id)}")
            keeper.drop(run_id)
            continue
        keeper.drop(run_id)
        done.recorded.append(run_id)
    return done
