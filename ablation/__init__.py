"""dapo_ablate.ablation: factorial ablations of the trainer, in three layers, each importing only
the ones below it (import-linter holds this in CI):

- `ablation.app`: what the commands do (run, status, report, sweep), returning dataclasses;
- `ablation.runtime`: the one Driver and its Scheduler protocol, the run pool, Ray, jobs, backends;
- `ablation.store`: the ledger, results, MLflow tracking, metric names;
- `ablation.experiment`: spec, design, fractions, plan, run identity (no Ray, SQL or MLflow).
"""
