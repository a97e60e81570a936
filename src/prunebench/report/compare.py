"""`prunebench-compare A B`: B against A, document by document, with a verdict per task a CI job can
gate on. A task is compared only where both runs read the same data (the digests of its dataset
inputs, or the hub for both), its documents paired by id; another limit pairs the shared ones, said. A and B are
each a run id, a sweep's parent run id (its jobs) or `latest` (the newest sweep).
Two runs: every task both evaluated. Two sweeps: runs paired by model, pruner, its config, ratio,
task, seed and recovery; a sweep whose pruned runs were all recovered by one recipe pairs with one
whose pruned runs were all unrecovered (or recovered by another), w/ tune against w/o tune, the
recovery's own seed aside; the output says which side was recovered. Exit code: 0 every comparison kept, 1 any
lost, 2 inconclusive only; 3 a run or
sweep that does not exist or nothing to compare (nothing printed but the error); 64 a usage error."""

from __future__ import annotations

import argparse
import math
import os
import sys

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException

from prunebench.report.build import latest_sweep
from prunebench.report.paper import (ROW_KEYS, judge, labels, task_results, tolerance, tunes,
                                     without_recovery_seed)
from prunebench.report.predictions import Predictions, task_data
from prunebench.report.settings import chat_setting
from prunebench.report.table import UNRECOVERED, load_runs, to_markdown
from prunebench.report.verdicts import CORRECTIONS, exit_code, paired, with_adjusted
from prunebench.tracking.store import missing_store, tracking_uri

NOT_FOUND, USAGE = 3, 64
PAIR_KEYS = ["model", "pruner", "config", "ratio", "task", "seed"]


class NotFound(LookupError):
    """A run id, sweep or `latest` that names nothing, or two sides with nothing in common."""


def resolve(spec: str, experiment: str) -> tuple[pd.DataFrame, bool]:
    """(the FINISHED job runs `spec` names, whether it is a sweep)."""
    if spec == "latest":
        if mlflow.get_experiment_by_name(experiment) is None:
            raise NotFound(f"no experiment named {experiment!r} in {mlflow.get_tracking_uri()}, so no latest sweep")
        spec = latest_sweep(experiment)
        if spec is None:
            raise NotFound(f"experiment {experiment!r} has no sweep: name a run id instead of 'latest'")
    try:
        run = mlflow.MlflowClient().get_run(spec)
    except MlflowException:
        raise NotFound(f"no run {spec!r} in {mlflow.get_tracking_uri()} (a run id, a sweep's parent run id, or "
                       f"'latest')") from None
    name = mlflow.get_experiment(run.info.experiment_id).name
    if run.data.tags.get("prunebench.sweep") == "true":
        runs = load_runs(name, spec)
        if runs.empty:
            raise NotFound(f"sweep {spec} has no FINISHED job")
        return runs, True
    if run.info.status != "FINISHED" or "prunebench.run_key" not in run.data.tags:
        raise NotFound(f"run {spec} is no FINISHED prunebench job (status {run.info.status})")
    return mlflow.search_runs(experiment_ids=[run.info.experiment_id], filter_string=f"attributes.run_id = '{spec}'"), False


def pruned_recoveries(results: pd.DataFrame) -> set[str]:
    """The recovery configs of a side's pruned runs (its dense run, reused by every sweep, has none)."""
    return set(results.recovery[results.pruner != "none"])


def recovery_note(first: pd.DataFrame, second: pd.DataFrame, sweeps: bool) -> str:
    """Which side was recovered, by which recipe, when either was ('' when neither); for two runs,
    whether B is A's counterpart (the same setting, pruner config, ratio and seeds, the recovery
    aside) or they differ in more."""
    named = tunes(pd.concat([first, second]))
    recoveries = [pruned_recoveries(side) for side in (first, second)]
    if recoveries[0] | recoveries[1] <= {UNRECOVERED}:
        return ""
    said = [", ".join(sorted(named[r] for r in side)) or "dense" for side in recoveries]
    note = f"A: {said[0]}; B: {said[1]}"
    if not sweeps and recoveries[0] != recoveries[1]:
        keys = [k for k in ROW_KEYS if k != "recovery"]
        rows = [side[keys].assign(seed=side.seed.map(without_recovery_seed)).drop_duplicates().reset_index(drop=True)
                for side in (first, second)]
        note += (" (one pruned model w/o and w/ tune)" if rows[0].equals(rows[1])
                 else " (they differ in more than the recovery)")
    return note


def with_chat(a: pd.DataFrame, b: pd.DataFrame, first: pd.DataFrame, second: pd.DataFrame,
              notes: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, bool]:
    """Each result row's chat format (report/settings.py: a chat template or raw prompts). Where a side
    ran several, rows pair only with rows of their own format (True: pair on it); where each side ran
    one and they differ, they pair, and `notes` gains a warning: every prompt differs, so B against A
    measures the chat format as much as the model."""
    chat_of = {run.run_id: chat_setting(run) for _, run in pd.concat([a, b]).iterrows()}
    first, second = (side.assign(chat=side.run_id.map(chat_of)) for side in (first, second))
    formats = [sorted(set(side.chat)) for side in (first, second)]
    if len(formats[0]) > 1 or len(formats[1]) > 1:
        return first, second, True
    if formats[0] != formats[1]:
        notes.append(f"warning: A ran chat={', '.join(formats[0])} and B chat={', '.join(formats[1])}: templated and "
                     f"raw prompts are different evaluations, so the differences below are the chat format's as "
                     f"much as the model's")
    return first, second, False


def comparisons(a: pd.DataFrame, b: pd.DataFrame, sweeps: bool, max_drop: float, correction: str,
                notes: list[str]) -> tuple[pd.DataFrame, str]:
    """B against A per paired task; `notes` gains what was not compared, or paired only in part.
    Returns the table and `recovery_note`."""
    first, second = task_results(a), task_results(b)
    said = recovery_note(first, second, sweeps)
    first, second, by_chat = with_chat(a, b, first, second, notes)
    keys = ([*PAIR_KEYS, "recovery"] if sweeps else ["task"]) + (["chat"] if by_chat else [])
    recoveries = [pruned_recoveries(side) for side in (first, second)]
    # the rows say their recovery where the sides hold several (the note says it where each holds one)
    tuned = tunes(pd.concat([first, second])) if sweeps and said else {}
    if sweeps and len(recoveries[0]) == len(recoveries[1]) == 1 and recoveries[0] != recoveries[1]:
        tuned = {}
        # one recipe a side and not the same: w/ tune against w/o tune (or recipe against recipe), the
        # recovery's seed aside; everything else must still match
        first, second = (side.assign(recovery="", seed=side.seed.map(without_recovery_seed)) for side in (first, second))
    pairs = first.merge(second, on=[*keys, "metric"], suffixes=("_a", "_b"))
    if pairs.empty:
        raise NotFound("the two sides share no " + ("job (model, pruner, config, ratio, task, seed, recovery)" if sweeps
                                                    else "task with the same metric"))
    named = labels(pd.concat([first, second]))
    predictions, rows = Predictions(), []
    for _, r in pairs.iterrows():
        data = [task_data(r[f"run_id_{side}"], r.task) for side in "ab"]
        if set(data[0]) != set(data[1]):  # the same task name over other documents: document i is not document i
            read = [", ".join(f"{name}@{digest[:8]}" for digest, name in sorted(d.items())) or "the hub" for d in data]
            notes.append(f"{r.task}: not compared, A and B read other data (A: {read[0]}; B: {read[1]})")
            continue
        docs = [predictions.values(r[f"run_id_{side}"], r.task, r.metric) for side in "ab"]
        if None in docs:
            continue
        ref, new = paired(docs[0][1], docs[1][1])
        if not ref:
            continue
        if len(ref) < max(len(docs[0][1]), len(docs[1][1])):  # another limit: only the shared documents
            notes.append(f"{r.task}: A evaluated {len(docs[0][1])} documents and B {len(docs[1][1])}; "
                         f"the {len(ref)} both evaluated are paired")
        row = {"model": r.model, "pruner": named[r.pruner, r.config], "ratio": r.ratio,
               **({"tune": tuned[r.recovery]} if tuned else {}), **({"chat": r.chat} if by_chat else {})} if sweeps else {}
        rows.append({**row, "task": r.task, "metric": docs[0][0],
                     **judge(ref, new, max_drop)})
    if not rows:
        raise NotFound("; ".join(notes) if notes else
                       "no paired task has per-document values (corpus metrics such as MCC have none)")
    return with_adjusted(rows, correction), said


def check_max_drop(parser: argparse.ArgumentParser, max_drop: float) -> None:
    """A tolerance is a finite drop of 0 or more points (-1 judged a zero difference lost, nan nothing)."""
    if not math.isfinite(max_drop) or max_drop < 0:
        parser.error(f"--max-drop {max_drop}: a tolerance is a drop, a finite number of 0 or more points")


class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(USAGE, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="prunebench-compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="the reference: a run id, a sweep's parent run id, or 'latest'")
    parser.add_argument("b", help="the candidate, compared with A: a run id, a sweep's parent run id, or 'latest'")
    parser.add_argument("--max-drop", type=float, default=1.0, metavar="POINTS",
                        help="the drop from A that still counts as kept (default 1.0 point; for a perplexity, "
                             "a rise of that many percent)")
    parser.add_argument("--correction", choices=CORRECTIONS, default="holm",
                        help="how the p-values are adjusted across the comparisons (default holm)")
    parser.add_argument("--experiment", default="prunebench", help="where 'latest' looks (default prunebench)")
    parser.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    args = parser.parse_args(argv)
    check_max_drop(parser, args.max_drop)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    uri = tracking_uri(args.tracking_uri)
    mlflow.set_tracking_uri(uri)
    try:
        if (missing := missing_store(uri)) is not None:
            raise NotFound(missing)
        (a, sweep_a), (b, sweep_b) = resolve(args.a, args.experiment), resolve(args.b, args.experiment)
        if set(a.run_id) == set(b.run_id):
            raise NotFound(f"A ({args.a}) and B ({args.b}) are one {'sweep' if sweep_a else 'run'} "
                           f"({', '.join(sorted(set(a.run_id)))[:200]}): nothing to compare it with")
        if sweep_a != sweep_b:
            raise NotFound(f"{args.a if sweep_a else args.b} is a sweep and {args.b if sweep_a else args.a} a single run: "
                           "compare two runs or two sweeps")
        notes: list[str] = []
        table, recovered = comparisons(a, b, sweep_a, args.max_drop, args.correction, notes)
    except NotFound as err:
        print(f"prunebench-compare: {err}", file=sys.stderr)
        return NOT_FOUND
    for note in notes:
        print(f"prunebench-compare: {note}", file=sys.stderr)
    name = "Holm" if args.correction == "holm" else "Benjamini-Hochberg"
    print(f"B ({args.b}) against A ({args.a}): points, 95% intervals, p adjusted by {name} across "
          f"{len(table)} comparisons, {tolerance(table, args.max_drop)}" + (f"\nrecovery: {recovered}" if recovered else "")
          + "\n")
    print(to_markdown(table))
    code = exit_code(table.verdict.tolist())
    counts = table.verdict.value_counts().to_dict()
    print(f"\n{', '.join(f'{n} {v}' for v, n in counts.items())}: exit {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
