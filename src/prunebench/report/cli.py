"""`prunebench-report`: the grid of an experiment as a Markdown table (and CSV), from MLflow."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mlflow

from prunebench.report.table import load_runs, results_table, to_markdown
from prunebench.tracking.store import tracking_uri


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prunebench-report", description=__doc__)
    parser.add_argument("--experiment", default="prunebench", help="MLflow experiment name")
    parser.add_argument("--sweep", default=None, help="only the jobs of this sweep (parent run id)")
    parser.add_argument("--out", default=None, help="also write results.md and results.csv here")
    parser.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    args = parser.parse_args(argv)
    mlflow.set_tracking_uri(tracking_uri(args.tracking_uri))
    if mlflow.get_experiment_by_name(args.experiment) is None:
        print(f"prunebench-report: no experiment named {args.experiment!r} in {mlflow.get_tracking_uri()}",
              file=sys.stderr)
        return 2
    runs = load_runs(args.experiment, args.sweep)
    if runs.empty:
        print(f"prunebench-report: experiment {args.experiment!r} has no FINISHED prunebench runs", file=sys.stderr)
        return 1
    table = results_table(runs)
    markdown = to_markdown(table)
    print(markdown)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text(markdown + "\n")
        table.to_csv(out / "results.csv", index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
