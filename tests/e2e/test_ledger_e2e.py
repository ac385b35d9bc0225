"""The slower cases of tests/unit/test_ledger.py (a second process reading the ledger while a writer
holds its lock): in this tree so the fast tier stays near a minute."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading

from dapo_ablate.ablation.store.ledger import (
    SQLLedger,
)

from support import HANG_GUARD_S
from test_ledger import make_runs  # noqa: F401, F811 - shared with the fast part


def test_status_from_a_second_process_while_a_writer_holds_the_lock(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with SQLLedger(url) as ledger:
        ledger.ensure_experiment("exp", {})
        ledger.add_runs("exp", make_runs(range(3)))
        writer = sqlite3.connect(
            tmp_path / "ledger.db", isolation_level=None, check_same_thread=False
        )
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE runs SET status = 'running'")  # not committed yet
        status = (
            "import json, sys; from dapo_ablate.ablation.store.ledger import SQLLedger; "
            "print(json.dumps(SQLLedger(sys.argv[1]).counts('exp')))"
        )
        try:
            shown = subprocess.run(
                [sys.executable, "-c", status, url], capture_output=True, text=True, timeout=HANG_GUARD_S
            )
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["pending"] == 3
            # A second writer waits for the lock (busy timeout) instead of failing.
            threading.Timer(0.3, writer.rollback).start()
            assert ledger.claim("run-00000-s0", "h:1")
        finally:
            writer.close()
