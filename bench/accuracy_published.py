"""Predicted vs published TFLOP/s per GPU for every entry of published_runs_dev.yaml.

    python bench/accuracy_published.py          # table with the shipped efficiency parameters
    python bench/accuracy_published.py --fit    # refit the two fitted parameters, print before/after
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import fields

from autotune.calibration import fit_efficiency, predict, published_measurements
from autotune.cost.efficiency import DEFAULT_EFFICIENCY, Efficiency
from autotune.report import plan_summary


def table(measured, eff: Efficiency) -> list[float]:
    print(f"{'run':<42}{'kind':>9}{'published':>11}{'predicted':>11}{'error':>8}  plan chosen")
    errors = []
    for m in measured:
        value, plan, _ = predict(m, eff)
        err = value / m.tflops_per_gpu - 1
        errors.append(err)
        print(f"{m.run_id:<42}{m.kind:>9}{m.tflops_per_gpu:>11.1f}{value:>11.1f}{err:>+8.1%}  {plan_summary(plan)}")
    abs_err = [abs(e) for e in errors]
    print(f"\nentries {len(errors)}   median |error| {statistics.median(abs_err):.1%}   "
          f"worst |error| {max(abs_err):.1%}   mean error {statistics.fmean(errors):+.1%}")
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", action="store_true", help="refit gemm_peak_fraction and gemm_half_dim")
    args = parser.parse_args()
    entries = published_measurements()
    measured = [m for m, _, _ in entries if m is not None]
    for m, rid, why in entries:
        if m is None:
            print(f"skipped {rid}: {why}")
    print()
    print("efficiency parameters (fitted: gemm_peak_fraction, gemm_half_dim; the rest are documented constants):")
    for f in fields(Efficiency):
        print(f"  {f.name:<22} {getattr(DEFAULT_EFFICIENCY, f.name)}")
    print()
    table(measured, DEFAULT_EFFICIENCY)
    if args.fit:
        fitted = fit_efficiency(measured)
        print(f"\nrefitted on {len(measured)} entries: gemm_peak_fraction={fitted.gemm_peak_fraction:.4f} "
              f"gemm_half_dim={fitted.gemm_half_dim:.2f}\n")
        table(measured, fitted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
