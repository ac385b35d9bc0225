"""``run | validate | status | ui`` of an experiment spec: load it with its command-line
overrides, check and plan it, run it on Ray, read where its runs stand, and open the MLflow UI
on its runs. Every user's mistake is a `UserError` (one sentence); nothing is written before the
checks pass."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from dapo_ablate.ablation.app.adaptive import look_lines, look_policy
from dapo_ablate.ablation.app.errors import UserError, user_errors
from dapo_ablate.ablation.app.provenance import origin_of
from dapo_ablate.ablation.app.specs import Experiment, load_experiment, names_a_sweep, other_runs_hint, shown  # noqa: F401 - the CLI's
from dapo_ablate.ablation.app.texts import command_line
from dapo_ablate.ablation.experiment.fractions import DesignError
from dapo_ablate.ablation.experiment.overrides import OverrideError
from dapo_ablate.ablation.experiment.plan import format_duration, format_plan
from dapo_ablate.ablation.experiment.spec import SpecError, run_root
from dapo_ablate.ablation.runtime.backends.verl import VerlTranslationError
from dapo_ablate.ablation.runtime.backends.registry import check_backends, estimate_note, plan_texts
from dapo_ablate.ablation.runtime.executor import ExperimentSummary, RunOptions, check_name_binding, check_own_folder, run_experiment
from dapo_ablate.ablation.runtime.preflight import check_contexts, preflight
from dapo_ablate.ablation.runtime.ray_connect import check_local_cpus
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import LedgerError
from dapo_ablate.ablation.store.results import NEW, ResultsError, run_time_calibration, status_rows
from dapo_ablate.ablation.store.metric_names import eval_source, headline_name
from dapo_ablate.ablation.store.runs_view import (
    RunsView,
    metric_column,
    mlflow_ui_command,
    param_column,
    pp_tag,
    runs_page_link,
    save_runs_view,
    tag_column,
)
from dapo_ablate.ablation.store.tracking import check_server_reachable, rebase_artifacts, sqlite_path
from dapo_ablate.core.config import ConfigError
from dapo_ablate.core.policy import policies_to_build

from dapo_ablate.core.contracts import METRIC_PATTERN

ERRORS = (SpecError, ConfigError, LedgerError, ExecutorError, ResultsError, DesignError, OverrideError,
          VerlTranslationError)
"""The user's mistakes these commands can meet (each one sentence)."""


@dataclass(frozen=True)
class Validation:
    """What `validate` (and `run --dry-run`) prints: the plan, where its runs stand in the ledger,
    and what the backends add (`Backend.plan_text`: for verl cells every job and a GPU-hour estimate)."""

    plan: str
    ledger: str
    backends: tuple[str, ...] = ()
    confirm: tuple[str, ...] = ()
    """design: adaptive in confirm mode: the predictions file and the terms its looks watch."""

    def lines(self) -> list[str]:
        return [self.plan, self.ledger, *self.backends, *self.confirm]


def validate(experiment: Experiment, address: str | None = None) -> Validation:
    """Check the spec's folders, stores and Ray address (`address` over ``executor.address``),
    that every run's prompt plus response ceiling fits its model's context, and that each run's
    backend can run it (e.g. verl every verl cell); writes nothing."""
    spec, plan = experiment.spec, experiment.plan
    with user_errors(*ERRORS):
        check_spec(spec, address)
        check_backends(spec, plan)
    policy = look_policy(spec)  # design: adaptive in confirm mode: the predictions file and the watched terms
    # measured run times, once any exist
    plan_text = format_plan(plan, calibration=run_time_calibration(spec, plan), estimate_note=estimate_note(plan))
    return Validation(plan_text, ledger_line(experiment), tuple(plan_texts(spec, plan)), confirm_lines(policy))


def confirm_lines(policy: Any) -> tuple[str, ...]:
    """``confirm  watching soft_overlong (predicted negative from dapo-small), ...`` (confirm mode only)."""
    confirm = getattr(policy, "confirm", None)
    if not confirm:
        return ()
    watched = ", ".join(f"{p['term']} (predicted {p['direction']} from {p['from_setting'] or 'another experiment'})"
                        for p in confirm["predicted"])
    return (f"confirm  {confirm['predictions']}: the looks watch only {watched}",)


def check_spec(spec: Any, address: str | None) -> None:
    """The checks `run` makes before Ray starts: folders, stores and Ray address (`address` over
    ``executor.address``), the name's binding, every prompt plus response ceiling in its context."""
    preflight(spec, address if address is not None else spec.executor.address)
    check_local_cpus(spec.executor, address if address is not None else spec.executor.address)
    check_name_binding(spec)  # as `run` refuses it: a name bound to another design
    check_contexts(spec)


def ledger_line(experiment: Experiment) -> str:
    """Where the plan's runs stand in the ledger (read only: a missing ledger is not created). A
    ledger that cannot be read is refused here as `run` refuses it, not counted as all to do."""
    plan = experiment.plan
    with user_errors(*ERRORS):
        _, counts = status_rows(experiment.spec, plan)
    done, total = counts.get("done", 0), len(plan.runs)
    to_do = total - done
    parts = ", ".join(f"{counts[key]} {key}" for key in ("done", "running", "failed", "pending", "new") if counts.get(key))
    return f"ledger   {parts}: {to_do} of {total} runs still to do" if to_do else f"ledger   all {total} runs done: nothing to run"


@dataclass(frozen=True)
class RunOutcome:
    """What `run` did (`summary`) and, once every run is done, the headline sentence it put on the
    experiment's MLflow parent run."""

    summary: ExperimentSummary
    headline: str | None = None
    browse: str = ""
    """The command serving the MLflow UI of the runs, on the experiment folder where the run
    recorded its spec (so it holds whatever overrides the run had)."""


def run(experiment: Experiment, address: str | None = None, options: RunOptions | None = None,
        cell_fn: Callable[..., dict[str, Any]] | None = None) -> RunOutcome:
    """Run every run of the plan that is not done yet (see `runtime.executor`). Raises
    `Interrupted` for a Ctrl-C or SIGTERM before any run started. The headline is computed from
    the finished runs the driver holds (`ExperimentSummary.records`), not read back."""
    options = options or RunOptions()
    with user_errors(*ERRORS):  # before any policy is built (`run_experiment` checks again, as for any caller)
        check_backends(experiment.spec, experiment.plan)
    build_policies(experiment, address)
    with user_errors(*ERRORS):
        summary = run_experiment(experiment.spec, experiment.plan, address=address, cell_fn=cell_fn, options=options,
                                 policy=look_policy(experiment.spec), origin=origin_of(experiment))
    browse = command_line("ui", shown(run_root(experiment.spec)))
    if summary.interrupted or not summary.all_done:
        return RunOutcome(summary, browse=browse)
    from dapo_ablate.ablation.app.report import experiment_headline  # the statistics load only now

    # the plan the driver ended with: design: adaptive, grown by every look stored, whoever made it
    headline = experiment_headline(experiment.spec, summary.plan or experiment.plan, summary.records, summary.parent_run_id)
    return RunOutcome(summary, headline, browse)


def build_policies(experiment: Experiment, address: str | None = None) -> None:
    """Build, on this machine and before Ray starts, the built-in policies the plan's runs
    need that neither ship nor are cached, each in a process whose progress shows on the console
    (a run would build it silently, in its Ray job's log). Only for a local Ray: a cluster's nodes
    build on first use. The spec's checks run first, so a refused spec builds nothing."""
    spec = experiment.spec
    if (address if address is not None else spec.executor.address) is not None:
        return
    models = [(run.config.model, run.config.data.builtin_task) for run in experiment.plan.runs]
    builds = policies_to_build(models)
    if not builds:
        return
    with user_errors(*ERRORS):
        check_spec(spec, address)
    for build in builds:
        print(f"building the built-in {build.words} before the first run (rough ~{format_duration(build.rough_s)}; "
              "once: it is cached) ...", flush=True)
        if subprocess.run(build.command(sys.executable)).returncode != 0:
            raise UserError(f"building the built-in {build.words} failed (its messages above say why); "
                            "the runs were not started")


@dataclass(frozen=True)
class Status:
    """The runs table of `status`: one dict per planned run (`store.results.status_rows`) and the
    number of runs per status."""

    rows: list[dict[str, Any]]
    counts: dict[str, int]
    note: str | None = None
    """When the ledger holds none of these runs but the experiment's folder records a `run` of
    other runs (other overrides): how to reach them."""
    looks: list[str] = field(default_factory=list)
    """design: adaptive: the current look, its decisions, the alpha spent and the budget left."""
    answer: str | None = None
    """Once every planned run is done: the headline and what the data support, the lines `run`
    ended with (`app.report.finished_answer`)."""

    @property
    def has_jobs(self) -> bool:
        """Some cells ran as Ray jobs (verl): their ids, to inspect with `ray job`."""
        return any(row["job_id"] for row in self.rows)


def status_metric_column(metric: str) -> tuple[str, Any]:
    """The status table's metric column: its header ("avg@32 (pp)" for an accuracy) and how a
    stored value reads in it (54.3; "" when missing)."""
    percent = bool(METRIC_PATTERN.match(metric))  # avg@k, pass@k, maj@k: fractions
    header = f"{metric} (pp)" if percent else metric
    return header, lambda value: "" if value is None else (f"{100 * value:.1f}" if percent else f"{value:.4g}")


def status(experiment: Experiment) -> Status:
    """The runs table. When the ledger holds none of the plan's runs (or refuses the spec, its
    name being bound to another design) and the experiment's folder records a `run` of other
    runs, `note` (or the refusal) says how to reach those. A name whose runs' folder records
    another experiment (two names, one folder) is refused as `run` refuses it."""
    with user_errors(*ERRORS):
        check_own_folder(experiment.spec)
    try:
        with user_errors(*ERRORS):
            rows, counts = status_rows(experiment.spec, experiment.plan)
    except UserError:
        hint = other_runs_hint(experiment, "status")
        if hint is None:
            raise
        raise UserError(f"the ledger's experiment {experiment.spec.name!r} holds other runs than this spec names; {hint}") from None
    hint = other_runs_hint(experiment, "status") if counts.get(NEW) == len(rows) else None
    with user_errors(*ERRORS):
        looks = look_lines(experiment.spec, experiment.plan)
    answer = None
    if rows and counts.get("done") == len(rows):  # every run done: the answer `run` ended with, computed the same way
        from dapo_ablate.ablation.app.report import finished_answer  # the statistics load only now

        answer = finished_answer(experiment)
    return Status(rows, counts, f"none of these runs is in the ledger: {hint}" if hint else None, looks, answer)


UI_HOST = "127.0.0.1"
HEADLINE_METRICS = ("full_vs_baseline", "ci_low", "ci_high")
"""The parent run's headline shown in the runs table (``reports.headline.headline_metrics``: under
``headline/``, in a transfer study under ``headline/<setting>/``)."""


@dataclass(frozen=True)
class UiServer:
    """The MLflow UI `ui` serves: its command, and the link that opens the experiment's runs."""

    command: list[str]
    port: int
    link: str
    """The runs table of the experiment (training workflow, view `store.runs_view.RUNS_VIEW_KEY`),
    or the experiments list when the store holds no experiment of this name yet."""
    opens: str
    """What the link opens, in words."""
    note: str | None = None
    experiment_id: str | None = None
    nonce: str | None = None
    """A random value put on the experiment as tag `UI_NONCE_TAG` just before the server starts:
    the server that answers on the port is this store's only if it shows it (`serves_this_store`)."""

    @property
    def health_url(self) -> str:
        """What `wait_for_ui` polls: MLflow's health check, "OK" once the server answers."""
        return f"http://{UI_HOST}:{self.port}/health"


UI_NONCE_TAG = "dapo.ui_nonce"


def ui_server(experiment: Experiment, port: int) -> UiServer:
    """The MLflow UI of the experiment's store on 127.0.0.1:`port`, once the checks pass (see
    `store_ui_server`), opening its runs view (`runs_view`)."""
    spec = experiment.spec
    opens = f"{spec.name}: its runs by {spec.metric}, with each factor's level and the headline"
    return store_ui_server(spec.tracking.uri, spec.name, runs_view(experiment), opens, experiment.command("run"), port)


def store_ui_server(uri: str, name: str, view: RunsView, opens: str, run_command: str, port: int) -> UiServer:
    """The MLflow UI of the store at `uri` on 127.0.0.1:`port`, once the checks pass: the store
    exists and the port is free. Then a copied or moved store (a `dapo-runs/` copied elsewhere)
    has its artifact locations moved to its own folder, so the UI shows the copy's artifacts, and
    experiment `name` gets its runs view `view` and its training kind tag; the link opens it
    (`opens` says what it shows), or the list of experiments while the store has no `name`."""
    store = sqlite_path(uri)
    if store is not None and not store.is_file():
        raise UserError(f"no MLflow store at {uri} yet; run `{run_command}` first")
    port = check_port_free(port)
    with user_errors(*ERRORS):
        check_server_reachable(uri, "check tracking.uri or --tracking")
    rebase_artifacts(uri)
    with user_errors(*ERRORS):
        experiment_id = save_runs_view(uri, name, view)
    link = runs_page_link(f"http://{UI_HOST}:{port}", experiment_id)
    if experiment_id is None:
        note = (f"the MLflow store at {uri} holds no experiment {name!r} yet "
                f"(`{run_command}` makes it); the link opens its list of experiments")
        return UiServer(mlflow_ui_command(uri, port), port, link, f"the store at {uri}", note)
    with user_errors(*ERRORS):
        nonce = mark_experiment(uri, experiment_id)
    return UiServer(mlflow_ui_command(uri, port), port, link, opens, experiment_id=experiment_id, nonce=nonce)


def mark_experiment(uri: str, experiment_id: str) -> str:
    """Put a fresh random value on the experiment (tag `UI_NONCE_TAG`); the value."""
    import secrets

    from dapo_ablate.ablation.store.tracking import store_errors

    nonce = secrets.token_hex(16)
    with store_errors(uri, "check tracking.uri or --tracking"):
        from mlflow import MlflowClient

        MlflowClient(uri).set_experiment_tag(experiment_id, UI_NONCE_TAG, nonce)
    return nonce


def serves_this_store(server: UiServer) -> bool:
    """Whether the server answering on the port shows this store: its experiment carries the value
    `mark_experiment` put on it (another program that took the port during the start-up does not)."""
    import http.client
    import json
    import urllib.request

    if server.nonce is None:
        return True
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    url = f"http://{UI_HOST}:{server.port}/ajax-api/2.0/mlflow/experiments/get?experiment_id={server.experiment_id}"
    try:
        with opener.open(url, timeout=30) as reply:
            tags = json.loads(reply.read()).get("experiment", {}).get("tags", [])
    except (OSError, http.client.HTTPException, ValueError, AttributeError):
        return False
    return any(isinstance(tag, dict) and tag.get("key") == UI_NONCE_TAG and tag.get("value") == server.nonce for tag in tags)


def runs_view(experiment: Experiment) -> RunsView:
    """The runs table a researcher reads first: the runs ranked by the spec's metric (its verl
    name on the children), shown in percentage points (`pp_tag`; one column per evaluation set;
    the fraction itself stays on each run's page), each factor's level (params
    ``factor.<name>``, and ``setting`` in a transfer study), and the parent's headline: the full
    recipe's gain over the baseline with its interval."""
    spec, plan = experiment.spec, experiment.plan
    configs = [run.config for run in plan.runs] or [spec.trainer]
    metrics = list(dict.fromkeys(headline_name(spec.metric, eval_source(config.to_dict())) for config in configs))
    settings = list(dict.fromkeys(run.setting for run in plan.runs if run.setting))
    prefixes = [f"headline/{setting}/" for setting in settings] or ["headline/"]
    params = [f"factor.{factor.name}" for factor in plan.factors] + (["setting"] if settings else [])
    columns = ([tag_column(pp_tag(name)) for name in metrics] + [param_column(name) for name in params]
               + [metric_column(prefix + name) for prefix in prefixes for name in HEADLINE_METRICS])
    widths = {tag_column(pp_tag(name)): 60 + 6 * len(name) for name in metrics}  # the whole verl name in view
    return RunsView(f"dapo-ablate: runs by {spec.metric}", metrics[0], tuple(columns), widths, tuple(metrics))


def check_port_free(port: int) -> int:
    """The port to serve on: `port`, refused when something already listens on it (the health
    check would answer for it); 0: a port the system says is free now (the link names it)."""
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no conflict
        try:
            probe.bind((UI_HOST, port))
        except OSError as err:
            raise UserError(f"port {port} on {UI_HOST} is not free ({err.strerror}); choose another with --port") from None
        return probe.getsockname()[1]


def wait_for_ui(server: UiServer, stopped: threading.Event, poll_s: float = 0.25) -> bool:
    """Poll the server's health check until it answers (True) or `stopped` is set (False)."""
    import http.client
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 is never behind a proxy
    while not stopped.is_set():
        try:
            with opener.open(server.health_url, timeout=5) as reply:
                if reply.status == 200:
                    return True
        except (OSError, http.client.HTTPException):  # not listening yet, or not ready to answer
            pass
        stopped.wait(poll_s)
    return False
