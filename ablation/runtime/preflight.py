"""Checks made before anything is written anywhere (`preflight`: `validate`, `run --dry-run`, and
the start of `run` and `sweep`): output and database folders where a file can really be created (no
symbolic link loop on the way), a run folder name the file system can hold, SQLite store files
that are SQLite databases, a writable artifact location, a ledger URL the ledger can open, database
and MLflow servers that answer within seconds, a reachable Ray address. `check_contexts`, for the
specs whose runs the real trainers train, a response ceiling that fits every model's context.
Each failure is one sentence naming the spec field and the fix."""

from __future__ import annotations

import errno
import itertools
import os
import re
import socket
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from dapo_ablate.ablation.experiment.spec import EVAL_CACHE_FOLDER, run_folder_name
from dapo_ablate.ablation.runtime.backends.registry import backend_of
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import LedgerError, check_ledger
from dapo_ablate.ablation.store.tracking import default_artifact_location, sqlite_path
from dapo_ablate.core.config import ConfigError, TrainerConfig, knob_paths
from dapo_ablate.core.config_errors import not_a_file_error, not_a_file_mode, shown_path
from dapo_ablate.core.policy import check_context

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec

SQLITE_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file (an empty file is a fresh database too)."""
CONTEXT_KNOBS = ("model.path", "rollout.max_response_len", "verl.max_prompt_length")
"""The trainer fields that decide whether a prompt plus the response ceiling fits the model."""


def preflight(spec: ExperimentSpec, address: str | None) -> None:
    """Refuse, before anything is written anywhere, an unusable output, database or artifact
    folder, a run folder name too long for the file system or naming another thing kept there, a store file that is not a SQLite
    database, a ledger URL the ledger cannot open, an unreachable ledger or MLflow server, or an
    unreachable Ray address (each check bounded to seconds). `spec`: an experiment's or a sweep's."""
    check_run_folder(spec)
    for field_name, uri in (("ledger", spec.ledger), ("tracking.uri", spec.tracking.uri)):
        path = sqlite_path(uri)
        if path is not None:
            check_writable_folder(path.parent, field_name)
            check_sqlite_file(path, field_name)
    check_artifact_location(spec)
    check_own_names(spec, Path(spec.output_dir).expanduser().absolute() / run_folder_name(spec.name))
    check_ledger_url(spec.ledger)
    check_database(spec.ledger, "ledger")
    check_tracking_store(spec.tracking.uri)
    if address:
        check_ray_address(address)


def check_run_folder(spec: Any) -> None:
    """The run folders' parent, ``output_dir/<run_folder_name(name)>``, can be created, and its
    name fits the file system there (os.pathconf PC_NAME_MAX, in bytes)."""
    folder = Path(spec.output_dir).expanduser()
    name = run_folder_name(spec.name)
    existing = nearest_existing(folder, "output_dir")
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):  # a file system that does not say: the folder's creation will
        limit = None
    size = len(os.fsencode(name))
    if limit is not None and size > limit:
        raise ExecutorError(
            f"`name` makes a run folder name of {size} bytes, above the {limit} bytes a file name may have "
            f"in {str(existing)!r}; shorten the name"
        )
    check_writable_folder(folder, "output_dir")
    if os.path.lexists(folder / name):  # something already there (a file, a link loop) must be a folder
        check_writable_folder(folder / name, "output_dir")


_SIDE_FILES = ("", "-wal", "-shm", "-journal", ".lock")
"""A SQLite store's file and the ones SQLite and the ledger keep beside it."""


def check_own_names(spec: Any, root: Path) -> None:
    """The runs folder `root` the name gives is none of the other things the product keeps in
    the output folder: the shared evaluation cache, a SQLite store's file (or its journal or
    lock), MLflow's artifact folder (`name: ledger.db` stopped `run` in a FileExistsError once the
    ledger was made; `name: eval-cache` shared the cache's folder)."""
    own = {root.parent / EVAL_CACHE_FOLDER: "the evaluation cache every run of this output folder shares"}
    for field_name, uri in (("ledger", spec.ledger), ("tracking.uri", spec.tracking.uri)):
        path = sqlite_path(uri)
        if path is not None:
            own.update({path.expanduser().absolute().with_name(path.name + side): f"the `{field_name}` database's "
                        f"{'file' if not side else side.strip('-.') + ' file'}" for side in _SIDE_FILES})
    location = spec.tracking.artifact_location or default_artifact_location(spec.tracking.uri, spec.output_dir)
    if location and urlparse(location).scheme == "file":
        own[Path(url2pathname(urlparse(location).path))] = "MLflow's artifact folder (`tracking.artifact_location`)"
    for path, what in own.items():
        if os.path.realpath(path) == os.path.realpath(root):  # through links too: what the folder would be
            raise ExecutorError(f"`name` {spec.name!r} makes the runs folder {str(root)!r}, which is {what}; give the "
                                "experiment another name")


def nearest_existing(folder: Path, field_name: str) -> Path:
    """`folder` or its nearest ancestor that exists, following symbolic links; a loop of links
    or a link to nothing on the way is refused (a folder could never be created there)."""
    probe = folder.expanduser().absolute()
    while True:
        try:
            probe.stat()
            return probe
        except (FileNotFoundError, NotADirectoryError):
            if probe.is_symlink():
                raise ExecutorError(
                    f"`{field_name}` {str(folder)!r} runs through {str(probe)!r}, a symbolic link to nothing; "
                    "remove the link or choose another folder"
                ) from None
            probe = probe.parent
        except OSError as err:
            if err.errno == errno.ELOOP:
                link = next(part for part in [*reversed(probe.parents), probe] if _loops(part))
                raise ExecutorError(
                    f"`{field_name}` {str(folder)!r} runs through a loop of symbolic links at {str(link)!r}; "
                    "remove the loop or choose another folder"
                ) from None
            raise ExecutorError(
                f"`{field_name}` {str(folder)!r} cannot be reached ({str(probe)!r}: {err.strerror}); choose another folder"
            ) from None


def _loops(path: Path) -> bool:
    try:
        path.stat()
    except OSError as err:
        return err.errno == errno.ELOOP
    return False


def check_writable_folder(folder: Path, field_name: str) -> None:
    """`folder` exists and is writable, or could be created: its nearest existing ancestor is a
    folder where a file can really be created (a probe file, removed at once: `os.access` says
    yes to root even on /proc)."""
    probe = nearest_existing(folder, field_name)
    if not probe.is_dir():
        raise ExecutorError(
            f"`{field_name}` folder {str(folder)!r} cannot be created because {str(probe)!r} is a file; choose another folder"
        )
    try:
        handle, name = tempfile.mkstemp(prefix=".dapo-write-test-", dir=probe)
        os.close(handle)
        os.unlink(name)
    except OSError as err:
        raise ExecutorError(
            f"`{field_name}` folder {str(folder)!r} is not writable ({str(probe)!r}: {err.strerror}); choose another folder"
        ) from None


def check_sqlite_file(path: Path, field_name: str) -> None:
    """A SQLite store's file, where one exists already, is a writable regular file holding a
    SQLite database (or nothing yet). Reads its first 16 bytes; opens nothing as a database."""
    try:
        mode = path.stat().st_mode
        if stat.S_ISREG(mode):
            with open(path, "rb") as handle:
                header = handle.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as err:
        raise ExecutorError(f"`{field_name}` names {shown_path(path)}, which {not_a_file_error(err, path, f'fix `{field_name}`')}") from None
    why = not_a_file_mode(mode)
    if stat.S_ISDIR(mode):
        raise ExecutorError(f"`{field_name}` names {shown_path(path)}, which {why}, not a database file; "
                            f"name a file instead, e.g. {shown_path(path / path.name)}")
    if why:
        raise ExecutorError(f"`{field_name}` names {shown_path(path)}, which {why}; name a database file")
    if header and header != SQLITE_HEADER:
        raise ExecutorError(
            f"`{field_name}` names {shown_path(path)}, which is not a SQLite database; move that file away or name another one"
        )
    if not os.access(path, os.W_OK):
        raise ExecutorError(f"`{field_name}` names {shown_path(path)}, which is read-only; make it writable or name another file")


def check_artifact_location(spec: Any) -> None:
    """The MLflow artifact folder (tracking.artifact_location, else the store's default) can be
    written where it is a local folder (a path or a file: URI); other stores (s3://, a tracking
    server's default) are left to MLflow."""
    tracking = spec.tracking
    location = tracking.artifact_location or default_artifact_location(tracking.uri, spec.output_dir)
    if not location:
        return
    parsed = urlparse(location)
    if parsed.scheme == "file":
        folder = Path(url2pathname(parsed.path))
    elif parsed.scheme == "":
        folder = Path(location)
    else:
        return
    check_writable_folder(folder, "tracking.artifact_location")


def check_ledger_url(url: str) -> None:
    """`url` is a database the ledger opens (`store.ledger.check_ledger`, reading only): a SQLite
    file that is missing, empty or the ledger's own, or a PostgreSQL database."""
    try:
        check_ledger(url)
    except LedgerError as err:
        raise ExecutorError(f"`ledger`: {err}") from None


def check_contexts(spec: Any) -> None:
    """Every trainer the spec can run (the base or each setting, at each level of the factors and
    each bound or choice of a sweep's space that moves the model, the response ceiling or verl's
    prompt length) fits a prompt plus the response ceiling in its model's context
    (`core.policy.check_context`: config.json only). A prompt is as long as its backend counts it
    (`Backend.prompt_tokens`: at least 1 token on the built-in one, verl.max_prompt_length on verl's).
    Not part of `preflight`: a sweep's space is checked too, and `validate` and `run` make it for
    every run whatever cell function executes it."""
    for (field_name, setting), trainer in _trainers(spec):
        options = [_values(spec, trainer, path) for path in CONTEXT_KNOBS]
        for (model, *model_knob), (response, *response_knob), (prompt, *prompt_knob) in itertools.product(*options):
            knobs = [knob for knob in (model_knob, response_knob, prompt_knob) if knob]
            try:
                check_context(model, backend_of(trainer).prompt_tokens(prompt), response)
            except ConfigError as err:
                field_name = knobs[0][0] if knobs else field_name
                where = " ".join(filter(None, [setting, "with " + ", ".join(label for _, label in knobs) if knobs else ""]))
                raise ExecutorError(f"`{field_name}`: {where + ': ' if where else ''}{err}") from None


def _trainers(spec: Any) -> list[tuple[tuple[str, str], TrainerConfig]]:
    """((field, description), trainer) for the base trainer, or for each setting of a transfer study."""
    settings = spec.setting_trainers() if hasattr(spec, "setting_trainers") else [("", spec.trainer)]
    return [(("settings", f"setting {name!r}") if name else ("trainer", ""), trainer) for name, trainer in settings]


def _values(spec: Any, trainer: TrainerConfig, path: str) -> list[tuple[Any, ...]]:
    """The values the field at `path` takes in the spec's runs: (value,) for the trainer's own, or
    (value, spec field, knob setting) for a factor's two levels or a sweep range's bounds or choices."""
    section, key = path.split(".")
    leaf = {dotted: name for name, dotted in knob_paths().items()}[path]
    for entry in spec.factors or []:
        if isinstance(entry, dict) and leaf in entry:
            return [(value, "factors", f"{leaf}={value}") for value in entry[leaf]]
    dimension = (getattr(spec, "space", None) or {}).get(leaf)
    if dimension is not None:
        return [(value, "space", f"{leaf}={value}") for value in dimension.corner_values()]
    return [(getattr(getattr(trainer, section), key),)]


def check_database(url: str, field_name: str, timeout_s: int = 5) -> None:
    """A database server named by `url` accepts a connection within seconds (SQLite files are
    checked as folders). Reads nothing, writes nothing."""
    if sqlite_path(url) is not None or not url.startswith(("postgresql", "mysql")):
        return
    from sqlalchemy import create_engine
    from sqlalchemy.exc import ArgumentError, DBAPIError

    from dapo_ablate.ablation.store.database import with_psycopg_driver

    try:
        engine = create_engine(with_psycopg_driver(url), connect_args={"connect_timeout": timeout_s})
    except (ArgumentError, ImportError, ValueError) as err:
        raise ExecutorError(f"`{field_name}` {url!r} is not a usable database URL ({err}); fix `{field_name}`") from None
    try:
        with engine.connect():
            pass
    except DBAPIError as err:
        reason = (str(err.orig or err).strip().splitlines() or ["no answer"])[0]
        raise ExecutorError(
            f"could not connect to the {field_name} database at {url} ({reason}); start it or fix `{field_name}`"
        ) from None
    finally:
        engine.dispose()


def check_tracking_store(uri: str, timeout_s: float = 5.0) -> None:
    """The MLflow store answers within seconds: an HTTP tracking server's health endpoint, or a
    database server (an unreachable store used to be found only after minutes, once the ledger
    and Optuna study were written)."""
    if uri.startswith(("http://", "https://")):
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s):
                pass
        except urllib.error.HTTPError:
            return  # it answers; a proxy may not route /health
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", None) or err
            raise ExecutorError(
                f"the MLflow tracking server at {uri} does not answer ({reason}); start it or fix tracking.uri"
            ) from None
    else:
        check_database(uri, "tracking.uri")


def check_ray_address(address: str, timeout_s: float = 5.0) -> None:
    """A TCP connect to ``host:port`` of a Ray address (``auto`` and ``local`` are left to Ray)."""
    if address in ("auto", "local"):
        return
    match = re.fullmatch(r"(?:ray://)?\[?([^\]\s]+?)\]?:(\d+)", address.strip())
    if not match:
        raise ExecutorError(f"Ray address {address!r} is not host:port or ray://host:port; fix executor.address or --address")
    host, port = match.group(1), int(match.group(2))
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ExecutorError(f"cannot reach the Ray cluster at {address} ({reason}); start it or fix executor.address / --address") from None
