"""An experiment's name is bound to its design, so two different specs never merge into one ledger
experiment and one MLflow parent run (two different cells both named ``baseline s0`` in one
parent, the second spec's description over the first's).

The rule: a name belongs to the first spec that runs under it, up to its seeds and where and how
it runs. `experiment_digest` hashes what defines the experiment's runs other than their seeds:
``factors`` (with a knob's two levels), ``design``, ``resolution``, ``generators``, ``orderings``,
``settings`` and the base trainer config's non-default values (`identity.config_delta`, as run ids
hash it, so a release adding a trainer field with a harmless default keeps every digest). Seeds,
``executor``, ``tracking``, ``ledger``, ``output_dir`` and ``metric`` are left out: adding seeds
adds only their runs under the same name, and moving the stores keeps it. Anything else (another
factor, another knob level, another base config, such as an override ``trainer.x=...``) is another
experiment, refused with a sentence saying how to name it; the runs the two share are still
trained once (run ids are global in the ledger).

The digest is stored in the ledger's experiment row (`Ledger.ensure_experiment`) and as the tag
`DIGEST_TAG` on the MLflow parent run (`Tracker.parent_run`). A name recorded before digests
existed takes the first digest it is given.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo_ablate.ablation.experiment.identity import config_delta
from dapo_ablate.ablation.store.ledger_rules import ExperimentRecord, LedgerError
from dapo_ablate.ablation.store.tracking import DIGEST_TAG, flatten

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec

__all__ = ["DESIGN_FIELDS", "DIGEST_TAG", "check_binding", "check_folder", "design_of", "differences", "experiment_digest"]

DESIGN_FIELDS = ("factors", "design", "resolution", "generators", "orderings", "settings")
"""The spec fields the digest covers besides the base trainer config."""
ADAPTIVE_RULES = ("alpha", "spending", "effect_of_interest")
"""design: adaptive: the settings its error guarantee rests on, also covered (its budgets are not)."""
_MISSING = "(absent)"


def design_of(spec: ExperimentSpec) -> dict[str, Any]:
    """What the digest hashes (see the module docstring)."""
    data = spec.to_dict()
    design = {**{name: data.get(name) for name in DESIGN_FIELDS}, "trainer": config_delta(spec.trainer)}
    if design["settings"]:  # a setting's attributes describe it; they are not its design
        design["settings"] = [{k: v for k, v in setting.items() if k != "attributes"} for setting in design["settings"]]
    if spec.design == "adaptive":  # its error guarantee; budgets may change between invocations
        design["adaptive"] = {name: (data.get("adaptive") or {}).get(name) for name in ADAPTIVE_RULES}
    return design


def experiment_digest(spec: ExperimentSpec) -> str:
    """sha256 (hex) of the canonical JSON (sorted keys, no spaces) of `design_of(spec)`."""
    blob = json.dumps(design_of(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def check_binding(record: ExperimentRecord | None, spec: ExperimentSpec, url: str) -> None:
    """Refuse `spec` when the ledger's experiment of its name (`record`) is a sweep, or is bound
    to another design: LedgerError naming what differs and how to name this one."""
    if record is None:
        return
    if "space" in record.spec:
        raise LedgerError(f"the ledger at {url} already has a sweep named {spec.name!r}; {_rename(spec.name)}")
    if record.digest is None or record.digest == experiment_digest(spec):
        return
    found = differences(record.spec, spec)
    what = "; ".join(found) if found else "its design or base trainer config differs"
    raise LedgerError(
        f"the ledger at {url} already has an experiment named {spec.name!r} made from another spec ({what}); "
        f"a name stays bound to its factors, design, settings and base trainer config (seeds may change); {_rename(spec.name)}"
    )


def check_folder(name: str, folder: Path, recorded: list[str | None]) -> None:
    """Refuse the experiment `name` when its runs' `folder` already records another experiment or
    sweep (`recorded`: the names in its records): two names that differ only in characters a
    folder name cannot hold (``h3 x``, ``h3/x``) would share run folders, checkpoints and kept
    results. LedgerError naming both and how to rename."""
    other = next((found for found in recorded if found is not None and found != name), None)
    if other is not None:
        raise LedgerError(
            f"the experiment {name!r} would keep its runs in {folder}, which already holds the runs of {other!r} "
            f"(characters other than letters, digits, '.', '-' and '_' become '_' in a folder name); {_rename(name)}"
        )


def differences(stored: dict[str, Any], spec: ExperimentSpec, limit: int = 3) -> list[str]:
    """What differs between the spec the ledger recorded (`stored`, a `to_dict`) and `spec`, in the
    fields the digest covers: field names, and the base trainer's dotted keys with both values."""
    new = spec.to_dict()
    found = [f"{name} differ" if name.endswith("s") else f"{name} differs"
             for name in DESIGN_FIELDS if stored.get(name) != new.get(name)]
    before, after = flatten(stored.get("trainer") or {}), flatten(new["trainer"])
    for key in sorted(set(before) | set(after)):
        if before.get(key, _MISSING) != after.get(key, _MISSING):
            found.append(f"trainer.{key}: {_short(before.get(key, _MISSING))} -> {_short(after.get(key, _MISSING))}")
    return found[:limit] + ([f"{len(found) - limit} more"] if len(found) > limit else [])


def _rename(name: str) -> str:
    """How to rename: the command-line form shell-quoted, so a name holding `$(...)`, quotes or
    spaces pastes as the literal name it is."""
    return (f"give this spec another name, e.g. `name: {json.dumps(name + '-2')}` in the spec or "
            f"`{shlex.quote('name=' + name + '-2')}` on the command line (runs the two share are not trained again)")


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
