"""A verl run's checkpoints, sealed: its job resumes only from checkpoints its own jobs wrote.

verl 0.9.1 resumes by itself (``trainer.resume_mode=auto``): it reads
``latest_checkpointed_iteration.txt`` in the run's ``checkpoints/`` and loads the
``global_step_<n>`` folder it names (the actor's weights and optimizer state, and the dataloader's
state ``data.pt``, which verl's trainer loads with ``torch.load(weights_only=False)``: a pickle).
A run folder is writable by anyone who can write ``output_dir``, so a checkpoint folder copied
from another run, or made by hand, would be resumed as this run's own: a result the run did not
train, or code run on the cluster.

So the Ray task that submits and watches a run's job (`jobs.job_cell`) seals what the job writes,
and checks it before each submission:

- **Sealing** (`CheckpointSeal.observe`, each poll of a running job: when the checkpoint folder's
  entries or verl's tracker change; and once the job has ended, whatever its outcome): the file
  ``<run folder>/checkpoints-seal.json`` (`SEAL_FILE`, beside verl's folder, not in it) holds, for
  each ``global_step_<n>`` folder, every file in it (path, size, ``mtime_ns``, content digest),
  and the step the tracker names. Each step's entry and the tracker's carry their own seal
  (`core.seals`: HMAC-SHA256 under the experiment's worker key, of the run id, the run's config
  digest, the step and the files), so pruning can drop an entry without the key (`forget`), and
  nothing can be added without it. The file is written whole, never through a link
  (`atomic.write_text`).
- **Checking** (`CheckpointSeal.secure`, before every submission of the run's job, the first one
  included): a step folder without a valid entry, or whose files differ from it (added, removed,
  another size or mtime, another digest), or that holds a link or a special file; a checkpoint
  folder that is a link or not a folder; and a tracker that names anything but the step the seal's
  tracker names (or, that step being set aside, the newest kept step before it) are moved to
  ``<run folder>/checkpoints.set-aside-<time>/`` (renamed, never followed, never deleted: nothing
  computed is lost), the tracker rewritten to the kept step (or left out: verl trains from step 0),
  and one note says what was set aside and why. A checkpoint folder with no seal at all is not this
  run's: all of it is set aside. verl then resumes only from sealed state, and
  `verl_checkpoints.resumed_entrypoint` skips validation before training only when a sealed
  checkpoint remains.

The content digest stays cheap for checkpoints of hundreds of GB: a file of at most
`FULL_DIGEST_BYTES` is hashed whole (sha256); a larger one (a rank's weight or optimizer shard, GBs)
by its size, its first and last `SAMPLE_BYTES` and `SAMPLES` more blocks at offsets derived from
the key and its size (sha256 of them all), about 4.5 MiB of a 3 GB shard. A file replaced,
truncated, extended, copied from another run, or rewritten wholesale is caught; a small edit inside
a large file whose size and mtime are restored afterwards is caught only if it touches a sampled
block (the offsets cannot be aimed around without the key, but a few changed bytes in a 3 GB shard
are missed with high probability). The seal vouches for what was in the folder while the run's own
job ran, as the watching task saw it: a folder planted there during that time, or after the job
ended and before a task saw its end (a driver that was down meanwhile re-attaches and seals then),
is sealed with it. The key is as secret as the ledger (`core.seals`).

Only the run folder's own ``checkpoints/`` is sealed and checked: a user's override of
``trainer.default_local_dir`` (`verl_checkpoints.own_checkpoint_dir` is None) names a folder that is
not ours, and verl resumes from it untouched.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_ablate.core import seals
from dapo_ablate.core.atomic import UnreadableFile, read_regular, write_text

SEAL_FILE = "checkpoints-seal.json"
"""Beside verl's ``checkpoints/`` in the run's folder: what the run's own jobs wrote there."""
SET_ASIDE_PREFIX = "checkpoints.set-aside-"
"""What is not sealed is moved to ``<run folder>/checkpoints.set-aside-<time>-<random>/``."""
STEP_FOLDER = re.compile(r"global_step_([0-9]{1,18})")
_NUMBER = re.compile(r"[0-9]{1,18}")
TRACKER = "latest_checkpointed_iteration.txt"
"""verl's record of the newest checkpoint (read by ``resume_mode=auto``)."""
FORMAT = 1
FULL_DIGEST_BYTES = 16 * 2**20
"""A file of at most this many bytes is hashed whole."""
SAMPLE_BYTES = 256 * 2**10
SAMPLES = 16
"""A larger file: its first and last SAMPLE_BYTES and SAMPLES keyed blocks of SAMPLE_BYTES."""
MAX_FILES = 100_000
"""A step folder of more files than this is never sealed (verl writes a few per rank)."""
MAX_SEAL_BYTES = 64 * 2**20
_STEP_CONTEXT = b"dapo-ablate verl checkpoint\x00"
_TRACKER_CONTEXT = b"dapo-ablate verl tracker\x00"
_CHUNK = 4 * 2**20


class CheckpointsNotSetAside(RuntimeError):
    """What must be set aside could not be moved (a read-only run folder, ...): the job is not
    submitted, since verl would resume from it; the message is one sentence."""


class UnsealableFolder(ValueError):
    """A step folder that cannot be sealed (a link or special file in it, too many files); why."""


@dataclass
class Sealed:
    """A seal file's valid entries: {step: its files ``[path, size, mtime_ns, digest]``} and the
    step verl's tracker named, each with its HMAC."""

    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    tracker: dict[str, Any] | None = None

    def files(self, step: int) -> list[list[Any]] | None:
        entry = self.steps.get(step)
        return entry["files"] if entry else None

    @property
    def tracker_step(self) -> int | None:
        return self.tracker["step"] if self.tracker else None


@dataclass(frozen=True)
class CheckpointSeal:
    """The seal of one run's verl checkpoints: its ``checkpoints/`` `folder`, its run id, its
    config's digest and the experiment's worker `key`."""

    folder: Path
    run_id: str
    config_digest: str
    key: bytes = field(repr=False)

    @property
    def path(self) -> Path:
        return self.folder.parent / SEAL_FILE

    # -- sealing what the run's own job wrote ---------------------------------------------------

    def observe(self, last: object = None) -> object:
        """Seal the folder if it changed since `last` (what the previous call returned; None: seal
        now); what to pass next time. A failure to read or write (a file verl removes meanwhile, a
        full disk) leaves the seal as it was, for the next call to try again."""
        now = _signature(self.folder)
        if now == last and last is not None:
            return last
        try:
            self.refresh()
        except (OSError, UnsealableFolder):
            return None
        return now

    def refresh(self) -> None:
        """Seal every step folder in the checkpoint folder now, and the step verl's tracker names
        (files unchanged since the last seal keep their digest: only new or changed ones are read)."""
        if self.folder.is_symlink() or not self.folder.is_dir():
            return
        before = self.load()
        steps = {}
        for step, entry in _step_entries(self.folder).items():
            try:
                listing = _listing(entry)
            except UnsealableFolder:
                continue  # never sealed: set aside before the next submission
            old = before.files(step)
            files = old if old is not None and [f[:3] for f in old] == listing else self._digests(entry, listing)
            steps[step] = files
        named = _tracker_step(self.folder / TRACKER)
        tracker = named if named in steps else None
        if {s: before.files(s) for s in before.steps} == steps and before.tracker_step == tracker:
            return
        self._write(steps, tracker)

    def _digests(self, folder: Path, listing: list[list[Any]]) -> list[list[Any]]:
        return [[name, *_file_digest(folder / name, self.key)] for name, _, _ in listing]

    # -- checking before a submission -----------------------------------------------------------

    def secure(self) -> str | None:
        """Before a submission: set aside what the run's own jobs did not write (see the module
        docstring); the note saying what and why, or None when all of it is sealed."""
        if not os.path.lexists(self.folder):
            return None
        sealed = self.load()
        if self.folder.is_symlink() or not self.folder.is_dir():
            aside = {self.folder: "a link, not a folder" if self.folder.is_symlink() else "not a folder"}
            kept: dict[int, list[list[Any]]] = {}
        else:
            kept, aside = self._sort(sealed)
        resume = _resume_step(kept, sealed.tracker_step)
        tracker = self.folder / TRACKER
        if os.path.lexists(tracker) and self.folder not in aside:
            named = _tracker_step(tracker)
            if named is None or named != resume:
                aside[tracker] = _tracker_reason(named, resume)
        if not aside:
            return None
        where = _set_aside(self.folder.parent, list(aside))
        if tracker in aside and resume is not None:
            write_text(tracker, str(resume))
        self._write(kept, resume)
        listed = "; ".join(f"{path.name}: {why}" for path, why in aside.items())
        start = f"resumes from its sealed step {resume}" if resume is not None else "starts from step 0"
        return (f"its checkpoints held state this run's jobs did not write ({listed}); moved to {where} "
                f"(nothing deleted); its job {start}")

    def _sort(self, sealed: Sealed) -> tuple[dict[int, list[list[Any]]], dict[Path, str]]:
        """({step: files} of the step folders that match the seal, {path: why} of the others)."""
        kept, aside = {}, {}
        for step, entry in _step_entries(self.folder, links=True).items():
            why = self._mismatch(entry, sealed.files(step))
            if why is None:
                kept[step] = sealed.files(step)
            else:
                aside[entry] = why
        return kept, aside

    def _mismatch(self, entry: Path, files: list[list[Any]] | None) -> str | None:
        """Why the step folder `entry` is not the one sealed as `files` (None: it is)."""
        if entry.is_symlink() or not entry.is_dir():
            return "a link, not a folder" if entry.is_symlink() else "not a folder"
        if files is None:
            return "not sealed for this run"
        try:
            listing = _listing(entry)
        except UnsealableFolder as why:
            return str(why)
        except OSError as err:
            return f"cannot be read ({err.strerror})"
        if listing != [f[:3] for f in files]:
            return "its files changed since they were sealed (added, removed, another size or time)"
        for name, *sealed_file in files:
            try:
                if list(_file_digest(entry / name, self.key)) != sealed_file:
                    return f"the content of {name} changed since it was sealed"
            except OSError as err:
                return f"{name} cannot be read ({err.strerror})"
        return None

    # -- the seal file --------------------------------------------------------------------------

    def load(self) -> Sealed:
        """The seal file's entries sealed for this run under this key (others, and a file that is
        not a seal, count as nothing sealed)."""
        try:
            document = json.loads(read_regular(self.path, MAX_SEAL_BYTES))
        except (UnreadableFile, ValueError, RecursionError):
            return Sealed()
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            return Sealed()
        found = Sealed()
        steps = document.get("steps")
        for name, entry in (steps.items() if isinstance(steps, dict) else ()):
            if _NUMBER.fullmatch(name) and isinstance(entry, dict) and _valid_files(entry.get("files")) and \
                    seals.verify(entry.get("hmac"), self.key, _STEP_CONTEXT, *self._identity(int(name)),
                                 _canonical(entry["files"])):
                found.steps[int(name)] = entry
        tracker = document.get("tracker")
        if isinstance(tracker, dict) and isinstance(tracker.get("step"), int) and tracker["step"] in found.steps and \
                seals.verify(tracker.get("hmac"), self.key, _TRACKER_CONTEXT, *self._identity(tracker["step"])):
            found.tracker = tracker
        return found

    def _identity(self, step: int) -> tuple[str, str, str]:
        return self.run_id, self.config_digest, str(step)

    def _write(self, steps: dict[int, list[list[Any]]], tracker: int | None) -> None:
        entries = {str(step): {"files": files, "hmac": seals.seal(self.key, _STEP_CONTEXT, *self._identity(step),
                                                                  _canonical(files))}
                   for step, files in sorted(steps.items())}
        named = None if tracker is None else {
            "step": tracker, "hmac": seals.seal(self.key, _TRACKER_CONTEXT, *self._identity(tracker))}
        document = {"format": FORMAT, "run_id": self.run_id, "config_digest": self.config_digest,
                    "steps": entries, "tracker": named}
        write_text(self.path, json.dumps(document))


def forget(seal_path: Path, steps: list[int]) -> None:
    """Drop `steps` from the seal file at `seal_path` (their folders were pruned; the tracker's entry
    too if it names one of them). Needs no key: each entry carries its own seal, and dropping one
    only trusts less. A file that is not a seal is left for `CheckpointSeal.secure` to refuse."""
    if not steps:
        return
    try:
        document = json.loads(read_regular(seal_path, MAX_SEAL_BYTES))
    except (UnreadableFile, ValueError, RecursionError):
        return
    if not isinstance(document, dict) or not isinstance(document.get("steps"), dict):
        return
    for step in steps:
        document["steps"].pop(str(step), None)
    tracker = document.get("tracker")
    if isinstance(tracker, dict) and tracker.get("step") in steps:
        document["tracker"] = None
    write_text(seal_path, json.dumps(document))


# -- what is in a checkpoint folder -------------------------------------------------------------


def _signature(folder: Path) -> object:
    """What changes when verl adds or removes a step folder or rewrites its tracker (two stats)."""
    found = []
    for path in (folder, folder / TRACKER):
        try:
            info = os.lstat(path)
            found.append((info.st_ino, info.st_size, info.st_mtime_ns))
        except OSError:
            found.append(None)
    return tuple(found)


def _step_entries(folder: Path, links: bool = False) -> dict[int, Path]:
    """{step: path} of the ``global_step_<n>`` entries in `folder`: real folders, or with `links`
    anything at such a name (what a check must judge)."""
    found = {}
    for entry in folder.iterdir():
        match = STEP_FOLDER.fullmatch(entry.name)
        if match and (links or (entry.is_dir() and not entry.is_symlink())):
            found[int(match.group(1))] = entry
    return found


def _listing(folder: Path) -> list[list[Any]]:
    """``[path, size, mtime_ns]`` of every file under `folder` (sorted; never through a link);
    UnsealableFolder for a link, a special file or more than MAX_FILES files in it."""
    found: list[list[Any]] = []
    pending = [("", folder)]
    while pending:
        prefix, current = pending.pop()
        with os.scandir(current) as entries:
            for entry in entries:
                name = prefix + entry.name
                if entry.is_symlink():
                    raise UnsealableFolder(f"it holds a link ({name})")
                if entry.is_dir(follow_symlinks=False):
                    pending.append((name + "/", Path(entry.path)))
                elif entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    found.append([name, info.st_size, info.st_mtime_ns])
                else:
                    raise UnsealableFolder(f"it holds a special file ({name})")
                if len(found) > MAX_FILES:
                    raise UnsealableFolder(f"it holds more than {MAX_FILES} files")
    return sorted(found)


def _file_digest(path: Path, key: bytes) -> tuple[int, int, str]:
    """(size, mtime_ns, digest) of the regular file at `path`, opened without following a link:
    sha256 of all of it up to FULL_DIGEST_BYTES, else of its size and sampled blocks (module
    docstring)."""
    handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(handle, "rb") as opened:
        info = os.fstat(opened.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(0, "not a regular file")
        size, digest = info.st_size, hashlib.sha256()
        if size <= FULL_DIGEST_BYTES:
            left = size
            while left > 0 and (chunk := opened.read(min(_CHUNK, left))):
                digest.update(chunk)
                left -= len(chunk)
            return size, info.st_mtime_ns, "sha256:" + digest.hexdigest()
        digest.update(str(size).encode() + b"\x00")
        for offset in _sample_offsets(key, size):
            opened.seek(offset)
            digest.update(opened.read(SAMPLE_BYTES))
        return size, info.st_mtime_ns, "sampled:" + digest.hexdigest()


def _sample_offsets(key: bytes, size: int) -> list[int]:
    """The head, the tail and SAMPLES offsets drawn from an HMAC of the key and the size."""
    span = size - SAMPLE_BYTES
    drawn = []
    for index in range(SAMPLES):
        mac = hmac.new(key, f"dapo-ablate sample {size} {index}".encode(), hashlib.sha256).digest()
        drawn.append(int.from_bytes(mac[:8], "big") % (span + 1))
    return [0, span, *sorted(drawn)]


def _tracker_step(path: Path) -> int | None:
    """The step verl's tracker file names (a regular file holding a number), else None."""
    try:
        text = read_regular(path, 64).decode().strip()
    except (UnreadableFile, UnicodeDecodeError):
        return None
    return int(text) if _NUMBER.fullmatch(text) else None


def _resume_step(kept: dict[int, list[list[Any]]], sealed_tracker: int | None) -> int | None:
    """The step the run's job may resume from: the one the sealed tracker names if its folder is
    kept, else the newest kept step before it (a step after it may be a save cut short: verl writes
    its tracker only once a save is whole); None without a sealed tracker."""
    if sealed_tracker is None:
        return None
    earlier = [step for step in kept if step <= sealed_tracker]
    return max(earlier) if earlier else None


def _tracker_reason(named: int | None, resume: int | None) -> str:
    what = "names no step" if named is None else f"names step {named}"
    if resume is None:
        return f"{what}, and this run has no sealed save to resume from"
    return f"{what}, not this run's last sealed save (step {resume}; rewritten)"


def _set_aside(run_folder: Path, paths: list[Path]) -> str:
    """Move `paths` (links renamed, never followed) into a new set-aside folder in `run_folder`;
    its name."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    try:
        folder = Path(tempfile.mkdtemp(prefix=f"{SET_ASIDE_PREFIX}{stamp}-", dir=run_folder))
        for path in paths:
            os.rename(path, folder / path.name)
    except OSError as err:
        raise CheckpointsNotSetAside(
            f"{run_folder / 'checkpoints'} holds state this run's jobs did not write ({', '.join(p.name for p in paths)}), "
            f"and it could not be moved aside ({err.strerror}); move it out of the run folder and run again") from None
    return folder.name


def _valid_files(files: object) -> bool:
    return isinstance(files, list) and all(
        isinstance(f, list) and len(f) == 4 and isinstance(f[0], str) and isinstance(f[1], int)
        and isinstance(f[2], int) and isinstance(f[3], str) for f in files)


def _canonical(files: list[list[Any]]) -> str:
    return json.dumps(files, sort_keys=True, separators=(",", ":"))
