"""How few runs *any* group-sequential design could need for the fixed design's power: a bound
for the adaptive-experiment benchmark (`adaptive_sim.py`).

The setting is `adaptive_sim.py`'s: a 2^5 factorial, run noise sd 1.5 pp, a planted 1.5 pp
interaction (the hardest planted term; the 2 pp main effect is found sooner), 13 terms planted 0,
and the fixed 3-seed full factorial (96 runs) as the yardstick. Everything here is *easier* than
the real problem, so its figures are lower bounds on what a real adaptive design can do:

- the noise sd is known (z tests: no t quantiles, no variance estimates);
- the interaction is tested at Holm's second-step level alpha / 14 from the first look (as if the
  main effect were already supported);
- looks come every 16 or every 32 runs from 32 on (one seed of the half fraction; one seed of the
  full factorial), at any maximum.

Part 1, the oracle: a design that knows which term carries the effect and stops as soon as that
term is supported (it never has to rule the 13 null terms out). Exact boundaries and stopping
probabilities from the project's own recursive integration (`reports/spending.py`), Lan-DeMets
O'Brien-Fleming-type and Pocock-type spending; expected runs under the planted effect, for every
maximum from 64 to 160 runs, keeping the designs whose power reaches the fixed design's. Also
Wald's bound for continuous monitoring (any sequential test, looks after every run):
E[N] >= ((1 - b) ln((1 - b) / a) + b ln(b / (1 - a))) / (theta^2 / 2), a one-sided.

Part 2, the honest stop: the design must also decide the 13 null terms. Even with futility as
lenient as a non-binding beta-spending boundary (an effect of delta = 1.5 pp ruled out with total
probability beta, gsDesign's test.type 4), not the alpha-level repeated interval the product
uses, the experiment runs until the last of 15 terms is decided. Monte Carlo (independent z
paths: the terms' contrasts are orthogonal), `--paths` experiments per design. Part 3: the same
with futility calibrated to a 2 pp effect of interest, larger than the planted 1.5 pp: the design
stops sooner, and rules the interaction out too often.

    nice .venv/bin/python benchmarks/adaptive_bound.py            # ~10 s
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import stats

from dapo_ablate.reports.spending import boundaries, exit_probabilities

FIXED_RUNS, NOISE_SD, EFFECT, ALPHA, NULL_TERMS = 96, 1.5, 1.5, 0.05, 13
THETA = EFFECT / (2 * NOISE_SD)  # E[z] = THETA sqrt(runs): an effect's SE is 2 sd / sqrt(runs)
LEVEL = ALPHA / 14


def fixed_power() -> float:
    """The fixed design's power on the interaction, one z test at the same level."""
    z, x = stats.norm.isf(LEVEL / 2), THETA * np.sqrt(FIXED_RUNS)
    return float(stats.norm.cdf(x - z) + stats.norm.cdf(-x - z))


def oracle(step: int, most: int, spending: str) -> tuple[float, float]:
    """(power, expected runs) of the oracle design with looks at 32, 32 + step, ..., most."""
    looks = np.arange(32, most + 1, step, dtype=float)
    fractions = looks / most
    exits = exit_probabilities(boundaries(fractions, LEVEL, spending), fractions, THETA * np.sqrt(most))
    power = float(exits.sum())
    return power, float(exits @ looks + (1 - power) * most)


def wald_bound(power: float) -> float:
    """Wald's lower bound on E[N] under the alternative for a one-sided level LEVEL / 2 test."""
    a, b = LEVEL / 2, 1 - power
    return ((1 - b) * np.log((1 - b) / a) + b * np.log(b / (1 - a))) / (THETA**2 / 2)


def _futility(looks: np.ndarray, efficacy: np.ndarray, beta: float, rng, paths: int, delta: float) -> np.ndarray:
    """Non-binding beta-spending futility boundaries on |z| (Pocock-type spending of beta), by
    simulation under an effect of ``delta`` pp."""
    z = _paths(looks, delta / (2 * NOISE_SD), rng, paths)
    t = looks / looks[-1]
    spend = np.diff(np.concatenate([[0.0], beta * np.log1p((np.e - 1) * t)]))
    alive, lows = np.ones(paths, bool), []
    for k in range(len(looks)):
        within = np.where(alive, z[:, k], np.inf)
        low = min(float(np.quantile(within, spend[k], method="inverted_cdf")), efficacy[k]) if k < len(looks) - 1 else efficacy[k]
        lows.append(low)
        alive &= (z[:, k] >= low) & (z[:, k] < efficacy[k])
    return np.array(lows)


def _paths(looks: np.ndarray, theta: float, rng, paths: int) -> np.ndarray:
    """|z| at the looks of ``paths`` independent terms with E[z] = theta sqrt(runs)."""
    steps = np.diff(np.concatenate([[0.0], looks]))
    sums = np.cumsum(rng.standard_normal((paths, len(looks))) * np.sqrt(steps), axis=1) + theta * looks
    return np.abs(sums / np.sqrt(looks))


def every_term(step: int, most: int, spending: str, beta: float, rng, paths: int,
               delta: float = EFFECT) -> tuple[float, float, float]:
    """(power on the interaction, expected runs, any false claim) when all 15 terms must be
    decided, futility calibrated to an effect of interest of ``delta`` pp."""
    looks = np.arange(32, most + 1, step, dtype=float)
    efficacy = boundaries(looks / most, LEVEL, spending)
    futility = _futility(looks, efficacy, beta, rng, paths, delta)
    thetas = np.array([THETA] + [0.0] * NULL_TERMS)
    z = np.stack([_paths(looks, theta, rng, paths) for theta in thetas], axis=1)  # paths x terms x looks
    decided = np.zeros(z.shape[:2], dtype=int)  # 1 supported, -1 not supported
    runs = np.full(paths, looks[-1])
    done = np.zeros(paths, bool)
    for k in range(len(looks)):
        open_ = decided == 0
        decided[open_ & (z[:, :, k] >= efficacy[k])] = 1
        decided[(decided == 0) & (z[:, :, k] < futility[k])] = -1
        now = ~done & (decided != 0).all(axis=1)
        runs[now], done = looks[k], done | now
    return float((decided[:, 0] == 1).mean()), float(runs.mean()), float((decided[:, 1:] == 1).any(axis=1).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", type=int, default=100000, help="Monte Carlo experiments per design (part 2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start, rng = time.perf_counter(), np.random.default_rng(args.seed)
    target = fixed_power()
    print(f"fixed full factorial, {FIXED_RUNS} runs, one z test at alpha/14: power {target:.3f} on the 1.5 pp interaction")
    print(f"Wald's bound (continuous monitoring, any design): E[N] >= {wald_bound(target):.1f} runs")
    print("\npart 1, the oracle (watches only the planted term):")
    print("| looks every | spending | max runs | power | expected runs | share of 96 |")
    print("|---:|---|---:|---:|---:|---:|")
    for step in (16, 32):
        for spending in ("obrien_fleming", "pocock"):
            for most in range(64, 161, step):
                power, runs = oracle(step, most, spending)
                if power >= target:
                    print(f"| {step} | {spending} | {most} | {power:.3f} | {runs:.1f} | {runs / FIXED_RUNS:.0%} |")
                    break
    print("\npart 2, every term decided (non-binding beta-spending futility, beta = 1 - the fixed power):")
    print("| looks every | spending | max runs | power | expected runs | share of 96 | any false claim |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for step in (16, 32):
        for spending in ("obrien_fleming", "pocock"):
            for most in range(96, 193, 32):
                power, runs, false = every_term(step, most, spending, 1 - target, rng, args.paths)
                if power >= target - 0.005:
                    print(f"| {step} | {spending} | {most} | {power:.3f} | {runs:.1f} | {runs / FIXED_RUNS:.0%} | {false:.3f} |")
                    break
    print("\npart 3, futility calibrated to a 2 pp effect of interest (adaptive_sim's default delta), Pocock, looks every 16:")
    print("| beta | max runs | power | expected runs | share of 96 |")
    print("|---:|---:|---:|---:|---:|")
    for beta in (0.02, 0.05):
        power, runs, _ = every_term(16, 128, "pocock", beta, rng, args.paths, delta=2.0)
        print(f"| {beta:g} | 128 | {power:.3f} | {runs:.1f} | {runs / FIXED_RUNS:.0%} |")
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
