"""`dapo-ablate ui` on a copied `dapo-runs/`: it serves the copy (its artifacts, not the
original's), waits until MLflow answers and prints one link; MLflow's UI, loaded from that link in
headless Chromium, shows the experiment's runs table in the Model training pages (not GenAI's),
every run a row ranked by the spec's metric, with the metric, factor-level and headline columns.

The finished experiment is made once per module by the real `dapo-ablate run`, with a cell
function chosen through ``DAPO_ABLATE_CELL_FN=test_ui_e2e:finished_cell`` (no training).

MLflow 3's UI is a React app, so a plain ``--dump-dom`` shows an empty page. The browser test
drives Chromium over the DevTools protocol on a pipe (``--remote-debugging-pipe``: no websocket
library): it opens the printed link, waits for every run's row and the view's columns, reads the
table's cells by row and column id, and saves a screenshot (``runs-table.png`` in its tmp folder).

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_ui_e2e.py."""

from __future__ import annotations


"""Every wait below is for an event (a line printed, a process's exit, a row on the page); this
only ends a wait that would otherwise hang the suite, far past what a busy machine takes."""
