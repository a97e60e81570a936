"""`prunebench-report`: an experiment's grid (or one sweep's) as a Markdown table, CSV and plots."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException

from prunebench.report.build import LAYOUTS, latest_sweep, write_report
from prunebench.report.compare import NOT_FOUND, check_max_drop
from prunebench.report.verdicts import CORRECTIONS
from prunebench.tracking.store import missing_store, tracking_uri
from prunebench.tracking.sweep import DEFAULT_STALE_S, close_orphans, describe


def file_in_the_way(out: Path) -> Path | None:
    """The file at `out`, or at a folder above it, that keeps the report's folder from being made."""
    return next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prunebench-report", description=__doc__)
    parser.add_argument("--experiment", default="prunebench", help="MLflow experiment name")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--sweep", default="latest",
                       help="the jobs of this sweep: its parent run id, or 'latest' (default; the whole experiment "
                            "when it has no sweep)")
    scope.add_argument("--all", action="store_true",
                       help="every FINISHED run of the experiment, every sweep's (tables still never mix settings)")
    parser.add_argument("--out", default="reports/latest", help="folder for results.md, results.csv and plots")
    parser.add_argument("--suite", action="append", default=None, metavar="NAME",
                        help="average this suite (e.g. glue) across its single-task runs; repeatable "
                             "(default: every suite with single-task runs of at least two of its tasks)")
    parser.add_argument("--layout", choices=LAYOUTS, default="flat",
                        help="paper: also the paper's table (rows pruner config x ratio, mean +- std over seeds, "
                             "stability; paper.md/.csv/.tex), flips and McNemar tests against the dense run and "
                             "between rows (flips.csv, comparisons.csv) and paper.png")
    parser.add_argument("--max-drop", type=float, default=1.0, metavar="POINTS",
                        help="paper layout: the tolerance of the verdicts against the dense run (default 1.0 point; "
                             "for a perplexity, a rise of that many percent)")
    parser.add_argument("--correction", choices=CORRECTIONS, default="holm",
                        help="paper layout: how the verdicts' p-values are adjusted across the report (default holm)")
    parser.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    args = parser.parse_args(argv)
    check_max_drop(parser, args.max_drop)
    # one bar per downloaded predictions file would bury the table the paper layout prints
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    uri = tracking_uri(args.tracking_uri)
    if (missing := missing_store(uri)) is not None:
        print(f"prunebench-report: {missing}", file=sys.stderr)
        return NOT_FOUND
    mlflow.set_tracking_uri(uri)
    if mlflow.get_experiment_by_name(args.experiment) is None:
        print(f"prunebench-report: no experiment named {args.experiment!r} in {mlflow.get_tracking_uri()}",
              file=sys.stderr)
        return 2
    # a sweep killed outright is closed first, so that the report reads its true state
    close_orphans(uri, mlflow.get_experiment_by_name(args.experiment).experiment_id, DEFAULT_STALE_S)
    sweep = None if args.all else latest_sweep(args.experiment) if args.sweep == "latest" else args.sweep
    if sweep is not None and not args.all and args.sweep != "latest":
        try:
            run = mlflow.MlflowClient().get_run(sweep)
        except MlflowException:
            print(f"prunebench-report: no run {sweep!r} in {uri} (--sweep takes a sweep's parent run id, or latest)",
                  file=sys.stderr)
            return NOT_FOUND
        if run.data.tags.get("prunebench.sweep") != "true":
            print(f"prunebench-report: run {sweep} is a job, not a sweep's parent run (--sweep takes a sweep; "
                  f"--all reports the whole experiment)", file=sys.stderr)
            return NOT_FOUND
    if (not_folder := file_in_the_way(Path(args.out))) is not None:
        print(f"prunebench-report: --out {args.out}: {not_folder} is a file, not a folder; give a folder for "
              f"results.md, results.csv and the plots (made if missing)", file=sys.stderr)
        return 2
    try:
        out = write_report(args.experiment, sweep, Path(args.out), args.suite, args.layout, args.max_drop,
                           args.correction)
    except ValueError as err:
        print(f"prunebench-report: {err}", file=sys.stderr)
        return 2
    except LookupError as err:
        print(f"prunebench-report: {err}", file=sys.stderr)
        return 1
    print((out / ("paper.md" if args.layout == "paper" else "results.md")).read_text(), end="")
    covered = f"sweep {sweep}" if sweep else "the whole experiment"
    hint = " (--all: the whole experiment)" if sweep else ""
    print(f"\n(report of {covered}{hint}; written to {out}/: {', '.join(sorted(p.name for p in out.iterdir()))})")
    if sweep:
        mlflow.MlflowClient().log_artifacts(sweep, str(out), "report")
        describe(mlflow.MlflowClient(), sweep, (out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
