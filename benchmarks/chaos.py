"""A fault campaign against ``dapo-ablate run`` (results: benchmarks/README.md, "Fault campaign").

    .venv/bin/python benchmarks/chaos.py [--kills 20] [--seed 0] [--sleep 2] [--factors 4] [--seeds 4]

A tiny experiment (``--factors`` of the DAPO techniques in a full factorial x ``--seeds``; the
cell function ``benchmarks/chaos_cell.py:sleepy_cell`` sleeps ``--sleep`` s and records each call)
with its ledger in a fresh PostgreSQL database on 127.0.0.1:5432 (dropped afterwards) and MLflow
on SQLite. ``dapo-ablate run`` is started as a subprocess again and again and, in a seeded order:

- killed ``--kills`` times by SIGKILL (the driver alone), SIGTERM (the driver) or SIGINT (its
  process group, as Ctrl-C), either at a random moment after start-up began (one time in four) or
  a random moment after its first run started;
- once, the ledger database's connections are dropped (``pg_terminate_backend``) while runs are in
  flight;
- once, ``output_dir`` (a tmpfs of a few MB, when this runs as root; otherwise a plain folder and
  the event is skipped, said so) is filled while runs are in flight, then emptied again;

then rerun without faults until every run is done (``--retry-failed`` only if plain reruns stop
making progress, and that is reported). Printed: kills survived, runs lost, runs duplicated in the
ledger and in MLflow (child runs per run id), wasted run-seconds (cell calls beyond one per run x
``--sleep``), and what each fault did (exit status, leftover processes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import yaml
from sqlalchemy import create_engine, text

from dapo_ablate.ablation.runtime.reaper import session_pids

BENCH = Path(__file__).resolve().parent
COMMAND = str(Path(sys.executable).parent / "dapo-ablate")
ADMIN_URL = os.environ.get("DAPO_CHAOS_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
FACTORS = ("overlong_filter", "clip_higher", "soft_overlong", "token_level_loss", "dynamic_sampling")
NAME = "chaos"
PACKAGES = ("core", "ablation", "sweeps", "reports", "cli")


# -- the stores -----------------------------------------------------------------------------------
class Campaign:
    def __init__(self, root: Path, args: argparse.Namespace):
        self.root, self.args = root, args
        self.out = root / "out"
        self.calls = root / "calls.log"
        self.calls.touch()
        self.db = f"dapo_chaos_{uuid.uuid4().hex[:10]}"
        self.admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
        self.ledger_url = ADMIN_URL.replace("postgresql+psycopg://", "postgresql://").rsplit("/", 1)[0] + "/" + self.db
        self.mlflow_url = f"sqlite:///{root / 'mlflow.db'}"
        self.tmpfs = False
        self.spec = root / "spec.yaml"
        self.log: list[dict] = []
        self.kills, self.reruns, self.retry_failed_needed = 0, [], 0
        self.plans: set[frozenset[str]] = set()

    def __enter__(self) -> "Campaign":
        with self.admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{self.db}"'))
        self.out.mkdir()
        if os.geteuid() == 0:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.args.disk_mb}m", "tmpfs", str(self.out)],
                                  capture_output=True, text=True)
            self.tmpfs = done.returncode == 0
            self.tmpfs_note = done.stderr.strip()
        else:
            self.tmpfs_note = "not root: cannot mount a small tmpfs"
        self.write_spec()
        self.src = self.root / "src"
        if self.args.code == "head":  # other engineers edit the checkout under a running campaign
            (self.src / "dapo_ablate").mkdir(parents=True)
            archive = subprocess.run(["git", "-C", str(BENCH.parent), "archive", "HEAD", *PACKAGES],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(self.src / "dapo_ablate")], input=archive, check=True)
        return self

    def pythonpath(self) -> str:
        """The drivers' (and their Ray workers') PYTHONPATH: the HEAD snapshot first, if any."""
        return os.pathsep.join(p for p in [str(self.src) if self.args.code == "head" else "", str(BENCH),
                                           os.environ.get("PYTHONPATH", "")] if p)

    def __exit__(self, *exc) -> None:
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.out)], check=False)
        with self.admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)'))
        self.admin.dispose()

    def write_spec(self) -> None:
        data = {
            "name": NAME, "trainer": {}, "factors": list(FACTORS[: self.args.factors]), "seeds": self.args.seeds,
            "output_dir": str(self.out), "ledger": self.ledger_url, "tracking": {"uri": self.mlflow_url},
            "executor": {"max_concurrent": 2, "lease_s": 600},
        }
        self.spec.write_text(yaml.safe_dump(data))

    @property
    def expected(self) -> int:
        return 2 ** self.args.factors * self.args.seeds

    # -- ledger reads (plain SQL on the ledger database) --
    def sql(self, query: str) -> list[tuple]:
        engine = create_engine(self.ledger_url.replace("postgresql://", "postgresql+psycopg://"))
        try:
            with engine.connect() as connection:
                return [tuple(row) for row in connection.execute(text(query))]
        except Exception:  # the schema is not there yet
            return []
        finally:
            engine.dispose()

    def planned(self) -> set[str]:
        """Run ids the code in this checkout plans now (a fresh process: the drivers' code, which
        other engineers may change under a running campaign; every distinct plan is kept)."""
        code = ("import json, sys; from dapo_ablate.ablation.experiment.spec import load_spec; "
                "from dapo_ablate.ablation.experiment.design import expand; "
                "print(json.dumps([r.run_id for r in expand(load_spec(sys.argv[1])).runs]))")
        done = subprocess.run([sys.executable, "-c", code, str(self.spec)], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": self.pythonpath()}, cwd=self.root)
        ids = set(json.loads(done.stdout))
        self.plans.add(frozenset(ids))
        return ids

    def unfinished(self) -> int:
        done = {run for (run,) in self.sql("SELECT run_id FROM runs WHERE status = 'done'")}
        return len(self.planned() - done)

    def statuses(self) -> Counter:
        return Counter(dict(self.sql("SELECT status, count(*) FROM runs GROUP BY status")))


# -- the driver -----------------------------------------------------------------------------------
def start(campaign: Campaign, *extra: str) -> subprocess.Popen:
    env = {
        **os.environ, "DAPO_ABLATE_CELL_FN": "chaos_cell:sleepy_cell", "CHAOS_CALLS": str(campaign.calls),
        "CHAOS_SLEEP_S": str(campaign.args.sleep),
        "PYTHONPATH": campaign.pythonpath(),
    }
    log = open(campaign.root / "driver.log", "a")
    log.write(f"\n=== {time.strftime('%H:%M:%S')} run {' '.join(extra)}\n")
    log.flush()
    # SIGINT back to its default in the driver: a campaign started in the background (`... &` in a
    # non-interactive shell) inherits SIGINT ignored, and Python then keeps ignoring it, as a
    # background job should; the campaign's Ctrl-C must reach the driver like a terminal's.
    return subprocess.Popen([COMMAND, "run", str(campaign.spec), "--no-progress", *extra], cwd=campaign.root,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))




def reap(process: subprocess.Popen, wait_s: float = 90) -> tuple[int | None, int]:
    """Wait for the driver; (its exit status, processes of its session still alive 3 s after), all killed."""
    try:
        rc = process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        rc = None
    time.sleep(3)
    left = session_pids(process.pid)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if rc is None:
        rc = process.wait()
    return rc, len(left)


def wait_running(campaign: Campaign, process: subprocess.Popen, timeout: float = 180) -> bool:
    """Until this driver has started a cell call (True; a new line in the calls log, since the
    ledger's "running" rows may be a killed driver's) or has exited (False)."""
    before = campaign.calls.read_text().count("start ")
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            return False
        if campaign.calls.read_text().count("start ") > before:
            return True
        time.sleep(0.3)
    return process.poll() is None


# -- the faults -----------------------------------------------------------------------------------
def kill_once(campaign: Campaign, rng: random.Random) -> dict:
    signum = rng.choice([signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
    early = rng.random() < 0.25
    delay = rng.uniform(0.5, 8.0) if early else rng.uniform(0.0, 1.5 * campaign.args.sleep)
    process = start(campaign)
    if early:
        time.sleep(delay)
    elif wait_running(campaign, process):
        time.sleep(delay)
    alive = process.poll() is None
    if alive:
        if signum == signal.SIGINT:
            os.killpg(process.pid, signal.SIGINT)
        else:
            os.kill(process.pid, signum)
    rc, left = reap(process)
    return {"event": "kill", "signal": signal.Signals(signum).name, "moment": "start-up" if early else "mid-run",
            "delay_s": round(delay, 2), "killed": alive and rc != 0, "signal_ignored": alive and rc == 0, "rc": rc, "leftover_processes": left}


def drop_connections(campaign: Campaign, rng: random.Random) -> dict:
    process = start(campaign)
    running = wait_running(campaign, process)
    query = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
             f"WHERE datname = '{campaign.db}' AND pid <> pg_backend_pid()")
    with campaign.admin.connect() as connection:
        dropped = len(connection.execute(text(query)).fetchall())
    time.sleep(2 * campaign.args.sleep + 2)
    survived = process.poll() is None
    if survived:  # it rode out the blip: end it like Ctrl-C so later faults have work left
        os.killpg(process.pid, signal.SIGINT)
    rc, left = reap(process)
    return {"event": "drop-db-connections", "runs_in_flight": running, "connections_dropped": dropped,
            "driver_survived": survived, "rc": rc, "leftover_processes": left}


def fill_disk(campaign: Campaign, rng: random.Random) -> dict:
    if not campaign.tmpfs:
        return {"event": "full-disk", "skipped": campaign.tmpfs_note or "no tmpfs"}
    process = start(campaign)
    running = wait_running(campaign, process)
    filler = campaign.out / "filler"
    with open(filler, "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass
    time.sleep(2 * campaign.args.sleep + 2)
    survived = process.poll() is None
    if survived:
        os.killpg(process.pid, signal.SIGINT)
    rc, left = reap(process)
    filler.unlink()
    return {"event": "full-disk", "runs_in_flight": running, "driver_alive_after_s": 2 * campaign.args.sleep + 2
            if survived else None, "rc": rc, "leftover_processes": left, "statuses_after": dict(campaign.statuses())}


# -- the campaign ---------------------------------------------------------------------------------
def faults(campaign: Campaign, rng: random.Random) -> None:
    events = ["kill"] * campaign.args.kills
    for special in ("drop", "disk"):  # seeded positions, not first nor last
        events.insert(rng.randrange(1, len(events)), special)
    kills = 0
    for event in events:
        if not campaign.unfinished():
            print(f"  the experiment finished before {event}: make it bigger (--seeds)", flush=True)
            break
        record = {"kill": kill_once, "drop": drop_connections, "disk": fill_disk}[event](campaign, rng)
        kills += bool(record.get("killed"))
        record["statuses"] = dict(campaign.statuses())
        campaign.log.append(record)
        print("  " + json.dumps(record), flush=True)
    campaign.kills = kills


def finish_up(campaign: Campaign) -> None:
    """Plain reruns until done; --retry-failed once if failed runs are all that is left."""
    for attempt in range(6):
        statuses = campaign.statuses()
        if not campaign.unfinished():
            return
        extra = ("--retry-failed",) if attempt >= 2 and statuses.get("failed", 0) else ()
        if extra:
            campaign.retry_failed_needed = statuses["failed"]
        rc, left = reap(start(campaign, *extra), wait_s=600)
        campaign.reruns.append({"args": list(extra), "rc": rc, "leftover_processes": left,
                                "statuses": dict(campaign.statuses())})
        print("  rerun " + json.dumps(campaign.reruns[-1]), flush=True)


def mlflow_children(campaign: Campaign) -> Counter:
    from mlflow import MlflowClient

    from dapo_ablate.ablation.store.tracking import RUN_ID_TAG

    client = MlflowClient(campaign.mlflow_url)
    experiment = client.get_experiment_by_name(NAME)
    runs = client.search_runs([experiment.experiment_id], max_results=5000) if experiment else []
    return Counter(run.data.tags[RUN_ID_TAG] for run in runs
                   if RUN_ID_TAG in run.data.tags and run.info.status == "FINISHED")


def calls_per_run(campaign: Campaign) -> tuple[Counter, Counter]:
    starts, ends = Counter(), Counter()
    for line in campaign.calls.read_text().splitlines():
        kind, run, _ = line.split()
        (starts if kind == "start" else ends)[run] += 1
    return starts, ends


def tally(campaign: Campaign) -> dict:
    planned = campaign.planned()
    done = planned & {run for (run,) in campaign.sql("SELECT run_id FROM runs WHERE status = 'done'")}
    ledger_rows = Counter(run for (run,) in campaign.sql("SELECT run_id FROM runs"))
    results = Counter(run for (run,) in campaign.sql("SELECT run_id FROM results"))
    children = mlflow_children(campaign)
    starts, ends = calls_per_run(campaign)
    extra_calls = sum(starts.values()) - len(set(starts) & planned)
    return {
        "runs_planned": len(planned),
        "plans_seen": len(campaign.plans),
        "kills_survived": campaign.kills,
        "runs_lost": len(planned - (done & set(children))),
        "runs_duplicated_ledger": sum(1 for n in (ledger_rows | results).values() if n > 1),
        "runs_duplicated_mlflow": sum(1 for n in children.values() if n > 1),
        "ledger_runs": len(ledger_rows), "ledger_done": len(done), "mlflow_finished_children": sum(children.values()),
        "cell_calls": sum(starts.values()), "calls_beyond_one_per_run": extra_calls,
        "wasted_run_seconds": round(extra_calls * campaign.args.sleep, 1),
        "completed_calls_beyond_one_per_run": sum(n - 1 for n in ends.values() if n > 1),
        "retry_failed_needed_for": campaign.retry_failed_needed,
        "leftover_processes_after_driver_exit": sum(e.get("leftover_processes", 0) for e in campaign.log),
        "full_disk": "tmpfs" if campaign.tmpfs else f"skipped ({campaign.tmpfs_note})",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sleep", type=float, default=2.0, help="seconds per cell call")
    parser.add_argument("--factors", type=int, default=4, choices=range(1, 6))
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--disk-mb", type=int, default=8)
    parser.add_argument("--code", choices=("head", "worktree"), default="head",
                        help="drivers run a snapshot of HEAD (default) or the live checkout")
    parser.add_argument("--keep", action="store_true", help="keep the campaign folder (driver.log, calls.log)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    started = time.time()
    root = Path(tempfile.mkdtemp(prefix="dapo-chaos-"))
    with Campaign(root, args) as campaign:
        print(f"campaign in {root}: {campaign.expected} runs, ledger database {campaign.db}", flush=True)
        faults(campaign, rng)
        finish_up(campaign)
        figures = tally(campaign)
    figures["wall_s"] = round(time.time() - started, 1)
    print(json.dumps(figures, indent=2))
    if not args.keep:
        subprocess.run(["rm", "-rf", str(root)], check=False)
    ok = figures["runs_lost"] == 0 and figures["runs_duplicated_ledger"] == 0 and figures["runs_duplicated_mlflow"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
