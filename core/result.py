"""RunResult: what one training run hands back (and writes as result.json)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .atomic import write_text


@dataclass
class RunResult:
    """The outcome of `train()`.

    eval: evaluation curve, one dict per evaluation: {"step", "avg@k", "pass@k", "maj@k",
        "response_length", "truncation_rate"}; accuracy metrics are fractions in [0, 1].
    signals: one dict per rollout step (see `trainer.SIGNALS` for the documented keys).
    tokens_generated: response tokens sampled for training, including those discarded by dynamic
        sampling (evaluation tokens are counted apart, in eval_tokens).
    tokens_discarded: generated tokens of groups dynamic sampling dropped (filtered or surplus).
    wall_s: seconds of the rollout steps and their evaluations; the one-off work shared by the
        runs of an ablation is apart: setup_s (loading, or first building, the policy and the data)
        and initial_eval_s (the step-0 evaluation, often read from the cross-run cache).
    eval_problems: held-out problems evaluated; decontaminated: training problems removed because
        their normalised text is a held-out problem's.
    """

    config: dict[str, Any]
    eval: list[dict[str, float]] = field(default_factory=list)
    signals: list[dict[str, float]] = field(default_factory=list)
    tokens_generated: int = 0
    tokens_discarded: int = 0
    tokens_trained: int = 0
    eval_tokens: int = 0
    wall_s: float = 0.0
    setup_s: float = 0.0
    initial_eval_s: float = 0.0
    eval_problems: int = 0
    decontaminated: int = 0
    peak_rss_mb: float = 0.0
    steps: int = 0

    @property
    def final(self) -> dict[str, float]:
        """The last evaluation's metrics (without its step)."""
        return {k: v for k, v in self.eval[-1].items() if k != "step"} if self.eval else {}

    @property
    def initial(self) -> dict[str, float]:
        return {k: v for k, v in self.eval[0].items() if k != "step"} if self.eval else {}

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["final"] = self.final
        return out

    def save(self, path: str | Path) -> Path:
        """Write the result as JSON to `path`; ResultNotSaved (an OSError holding this result) when
        the file cannot be written (a full disk), so a finished run's result is never lost with it."""
        try:
            return write_text(path, json.dumps(self.to_dict(), indent=1))
        except OSError as err:
            raise ResultNotSaved(path, self, err) from err

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunResult":
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def load(cls, path: str | Path) -> "RunResult":
        return cls.from_dict(json.loads(Path(path).read_text()))


class ResultNotSaved(OSError):
    """A finished run's result.json could not be written: `result` holds the result, `reason` why."""

    def __init__(self, path: str | Path, result: RunResult, err: OSError):
        super().__init__(err.errno, err.strerror or str(err), str(path))
        self.result, self.reason = result, err.strerror or str(err)
