"""What dapo-ablate's commands do, as functions returning dataclasses. The CLI only parses options,
calls one of these and maps `UserError` (one sentence) to exit status 2.

One module per command family, so a command loads only what it uses (`dapo-ablate report --help`
does not import Ray, `run` does not import the statistics until its headline):

- `app.experiment`: load a spec with overrides, validate, run, status, the MLflow UI command;
- `app.report`: the report of an experiment or a results CSV, the headline on the MLflow parent;
- `app.sweep`: run a sweep, its dry-run plan, its report;
- `app.train`: train one configuration;
- `app.seeds`: seeds per cell for a wanted power.
"""
