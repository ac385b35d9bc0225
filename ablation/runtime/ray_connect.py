"""Connecting to Ray: a local Ray that is really local, or a cluster joined with its token.

Local (``executor.address`` null): ``ray.init(address="local")`` always starts this driver's own
Ray, whatever else runs on the machine -- a colleague's ``ray start`` cluster, or the
current-cluster file a crashed one left behind are never joined (a plain ``ray.init()`` would try
both).

Joining (``executor.address`` / ``--address``): Ray 2.5x+ heads started by ``ray start --head``
turn token authentication on when a token exists on the head, and ``ray.init(address=...)`` sends
no token unless ``RAY_AUTH_MODE=token`` is set. Before joining, the cluster's GCS is asked (a
sub-second gRPC call) whether it wants a token; if it does, the token is taken from, in order:

1. ``executor.auth_token_file`` in the spec (a file holding the token),
2. ``RAY_AUTH_TOKEN`` (the token itself) or ``RAY_AUTH_TOKEN_PATH`` (a file) in the environment,
3. ``~/.ray/auth_token`` (where ``ray start`` / ``ray get-auth-token --generate`` put it),

token mode is switched on for this process (and so for Ray's job client, which reads the same
settings), and the token is checked with a second call. A missing or refused token is one
sentence naming where the token was looked for, instead of Ray's 20-second
"Failed to connect" that reads like a wrong address.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo_ablate.ablation.runtime.reaper import _start_time, descendants, start_reaper
from dapo_ablate.ablation.runtime.signals import ctrl_c_held
from dapo_ablate.ablation.store.errors import ExecutorError

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec

MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
SPEC_FIELD = "executor.auth_token_file"
QUIET: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False}
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20
"""A local Ray's object store: results are small dicts, so a small store keeps memory free."""
_GCS_ADDRESS = re.compile(r"\[?([^\]\s/]+?)\]?:(\d+)")


class RayConnectError(RuntimeError):
    """A Ray address or token problem the user can fix; the message is one sentence."""


def default_token_path() -> Path:
    """Where ``ray start`` and ``ray get-auth-token --generate`` keep the token."""
    return Path.home() / ".ray" / "auth_token"


def token_source(token_file: str | None = None) -> str | None:
    """Where the token would come from (for messages), or None when there is none anywhere."""
    if token_file:
        return f"{SPEC_FIELD} ({token_file})"
    if os.environ.get(TOKEN_ENV):
        return f"the {TOKEN_ENV} variable"
    if os.environ.get(TOKEN_PATH_ENV):
        return f"{TOKEN_PATH_ENV} ({os.environ[TOKEN_PATH_ENV]})"
    path = default_token_path()
    return str(path) if path.is_file() and path.read_text(errors="replace").strip() else None


def enable_token(token_file: str | None = None) -> str:
    """Switch this process (and Ray's clients in it) to token authentication with the token from
    `token_file` or the environment; return where it came from. Raises RayConnectError when no
    token is found or the spec's file cannot be read."""
    if token_file:
        path = Path(token_file).expanduser()
        try:
            text = path.read_text(errors="replace").strip()
        except OSError as err:
            raise RayConnectError(
                f"{SPEC_FIELD} {token_file} cannot be read ({err.strerror or type(err).__name__}); "
                "copy the head's ~/.ray/auth_token there or fix the path"
            ) from None
        if not text:
            raise RayConnectError(f"{SPEC_FIELD} {token_file} is empty; copy the head's ~/.ray/auth_token (or `ray get-auth-token` output) into it")
        os.environ[TOKEN_PATH_ENV] = str(path.resolve())
        os.environ.pop(TOKEN_ENV, None)  # Ray prefers the variable over the file
    source = token_source(token_file)
    if source is None:
        raise RayConnectError(missing_token_sentence())
    os.environ[MODE_ENV] = "token"
    refresh_ray_auth()
    return source


def missing_token_sentence(address: str | None = None) -> str:
    where = f"the Ray cluster at {address}" if address else "the Ray cluster"
    return (
        f"{where} uses token authentication and no token was found: set {SPEC_FIELD} to a file holding "
        f"the head's token (its ~/.ray/auth_token, or `ray get-auth-token` there), or set {TOKEN_ENV} "
        f"or {TOKEN_PATH_ENV}"
    )


def refresh_ray_auth() -> None:
    """Make Ray's cached config and token loader see the environment just changed."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def gcs_address(address: str) -> str | None:
    """``host:port`` of a GCS address; None for ``auto``, ``local`` and ``ray://`` (Ray Client)."""
    address = address.strip()
    if address in ("auto", "local") or address.startswith("ray://"):
        return None
    return address if _GCS_ADDRESS.fullmatch(address) else None


def wants_token(gcs: str, timeout_s: float = 5.0) -> bool:
    """True when the GCS at `gcs` refuses this process's current credentials (none, or a wrong
    token). Other failures (unreachable, timeout) are left to ``ray.init`` to report."""
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        GcsClient(address=gcs).internal_kv_get(b"dapo-ablate-probe", namespace=None, timeout=timeout_s)
    except AuthenticationError:
        return True
    except Exception:  # noqa: BLE001 - reachability is reported by ray.init / the preflight
        return False
    return False


def prepare_auth(address: str, token_file: str | None = None) -> str | None:
    """Set up token authentication for joining `address`; return the token's source or None when
    the cluster needs none. Raises RayConnectError with one sentence when the token is missing
    or refused."""
    gcs = gcs_address(address)
    if gcs is None:
        # Ray Client / auto: no cheap probe; use a token when one was given explicitly.
        if token_file or os.environ.get(TOKEN_ENV) or os.environ.get(TOKEN_PATH_ENV):
            return enable_token(token_file)
        return None
    if os.environ.get(MODE_ENV, "").lower() != "token" and not wants_token(gcs):
        return None
    try:
        source = enable_token(token_file)
    except RayConnectError as err:
        if token_file:
            raise
        raise RayConnectError(missing_token_sentence(address)) from err
    if wants_token(gcs):
        raise RayConnectError(
            f"the Ray cluster at {address} refused the authentication token from {source}: "
            "it is not the head's token; copy the head's ~/.ray/auth_token (or `ray get-auth-token` there) "
            f"into {SPEC_FIELD} or {TOKEN_PATH_ENV}"
        )
    return source


def join_cluster(address: str, token_file: str | None = None, **init_kwargs: Any) -> None:
    """``ray.init`` joined to `address`, with its token when it uses token authentication."""
    import ray
    from ray.exceptions import AuthenticationError

    prepare_auth(address, token_file)
    try:
        ray.init(address=address, **{**QUIET, **init_kwargs})
    except AuthenticationError:
        raise RayConnectError(missing_token_sentence(address)) from None
    except (ConnectionError, RuntimeError, TimeoutError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RayConnectError(f"cannot join the Ray cluster at {address} ({first}); check executor.address / --address") from None


def check_local_cpus(executor: Any, address: str | None) -> int:
    """This machine's CPU count for a local Ray (`address` None or empty); ExecutorError when one run
    asks for more CPUs than it has (validate and the dry run refuse it as `run` does)."""
    cpus = os.cpu_count() or 1
    if not address and executor.cpus_per_run > cpus:
        raise ExecutorError(
            f"executor.cpus_per_run ({executor.cpus_per_run:g}) exceeds this machine's {cpus} CPUs; lower it or join a cluster with --address"
        )
    return cpus


def start_local(num_cpus: float, object_store_memory: int | None = None, **init_kwargs: Any) -> None:
    """Start this driver's own Ray, never joining another cluster on the machine (``ray start``
    or a stale current-cluster file; ``address="local"`` also wins over ``RAY_ADDRESS``)."""
    _start_local_ray(num_cpus=num_cpus, object_store_memory=object_store_memory, **{**QUIET, **init_kwargs})


def connect_ray(address: str | None, spec: ExperimentSpec) -> bool:
    """Join `address`, or start a local Ray sized to this machine; True if this call started
    Ray (and so should shut it down). A Ray already initialised in this process is reused.
    A Ctrl-C while Ray is imported or starts is held back until it has started (`ctrl_c_held`)."""
    with ctrl_c_held():
        import ray

    if ray.is_initialized():
        return False
    quiet = {"include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False}
    if address:
        try:  # with the cluster's token when it uses token authentication (ablation/ray_connect.py)
            with ctrl_c_held():
                join_cluster(address, spec.executor.auth_token_file, **quiet)
        except RayConnectError as err:
            raise ExecutorError(str(err)) from None
        return True
    cpus, executor = check_local_cpus(spec.executor, address), spec.executor
    # address="local": always a new Ray of our own; a bare ray.init() would join whatever cluster
    # Ray's current-cluster file names (a colleague's `ray start`, another driver's, a crashed one)
    _start_local_ray(num_cpus=cpus, object_store_memory=LOCAL_OBJECT_STORE_BYTES, **quiet)
    start_reaper()  # the local Ray's processes die with this driver, even after a SIGKILL
    if executor.gpus_per_run > ray.cluster_resources().get("GPU", 0):
        ray.shutdown()
        raise ExecutorError(
            f"executor.gpus_per_run ({executor.gpus_per_run:g}) exceeds the GPUs Ray finds here; set it to 0 or join a GPU cluster with --address"
        )
    return True


LOCAL_START_PAUSES_S = (10.0, 20.0, 30.0, 40.0)
"""Ray waits fixed times for a new node's processes (the driver 30 s for its raylet to register with
the GCS; the raylet for its dashboard agent's port file, or it aborts: seen 18-37 s after the agent
started); a machine loaded far past its cores can take longer ("The current node timed out during
startup"), so a local start that fails so is tried again, what it had started stopped first, after
each of these pauses in turn (five tries): a burst of load, such as other programs starting their
own processes, passes instead of meeting every try (benchmarks/ray_start_under_load.sh reproduces
both failures). Bounded backoff, as `store.transient.TRANSIENT_RETRIES` is for the stores."""


START_AGAIN = ("timed out during startup", "Failed to start GCS")
"""A local start that failed for the machine, not for its arguments: Ray's fixed waits passed on a
busy machine, or the GCS port Ray picked was taken before its GCS bound it (by another Ray starting
on the machine: its GCS then answers Ray's health check, with InvalidAuthToken when it uses token
authentication). Ray picks the ports again on the next try."""


def _start_local_ray(**init_kwargs: Any) -> None:
    """``ray.init(address="local", **init_kwargs)``, tried again when it fails to start for the
    machine (`START_AGAIN`); ExecutorError, one sentence, when every try did."""
    import ray

    pauses = (*LOCAL_START_PAUSES_S, None)
    for pause in pauses:
        before = _children_now()
        try:
            with ctrl_c_held():
                ray.init(address="local", **init_kwargs)
            return
        except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception for the start-up timeout
            _stop_interrupted_ray(before)
            if not any(words in str(err) for words in START_AGAIN):
                raise
            if pause is None:
                first = str(err).strip().splitlines()[0]
                raise ExecutorError(
                    f"this machine's local Ray failed to start {len(pauses)} times ({first}): the machine is "
                    "too busy for Ray's fixed start-up waits; run again when it is less loaded, or join a running "
                    "cluster with --address"
                ) from None
        except BaseException:  # Ctrl-C (once Ray started) or SIGTERM while Ray starts: stop what it has started
            _stop_interrupted_ray(before)
            raise
        time.sleep(pause)


def _children_now() -> set[tuple[int, int | None]]:
    """(pid, start time) of every process under this one (none known without /proc: macOS)."""
    if not os.path.isdir("/proc"):
        return set()
    me = os.getpid()
    return {(pid, _start_time(pid)) for pid in descendants([me]) if pid != me}


def _stop_interrupted_ray(before: set[tuple[int, int | None]]) -> None:
    """Stop what an interrupted ray.init had started. ray.shutdown() stops only what Ray had
    registered by then: the raylet's dashboard and runtime-env agents (about 200 MB) outlived
    it, orphaned, and the reaper is only started after ray.init. So every process started under
    this driver since ray.init began (`before`: the ones there already) is killed too."""
    import ray

    started = _children_now() - before  # now: the agents are the raylet's children until it dies
    ray.shutdown()
    for pid, start in started:
        if start is not None and _start_time(pid) == start:  # never a reused pid
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def capacity(spec: ExperimentSpec, runs: int) -> int:
    """Runs that fit at once in the connected Ray cluster's CPUs and GPUs (at least 1; `runs`
    when a run declares no resources)."""
    import ray

    total = ray.cluster_resources()
    executor = spec.executor
    fits = [int(total.get("CPU", 1) // executor.cpus_per_run)] if executor.cpus_per_run > 0 else []
    if executor.gpus_per_run > 0:
        fits.append(int(total.get("GPU", 0) // executor.gpus_per_run))
    return max(1, min(fits, default=runs))
