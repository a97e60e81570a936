"""`prunebench-export RUN_ID`: a run's pruned model, rebuilt from the config the run logged (its
scores from the score cache) and written as `export=hf` would have written it (docs/export.md).

The rebuilt model must be the one the run evaluated: its parameter counts and achieved sparsity are
compared with the run's metrics, and a difference (changed pruner code, a scorer that is not
deterministic) stops the export instead of publishing another model under the run's name."""

from __future__ import annotations

import argparse
import sys
import tempfile

import mlflow
from hydra.utils import get_class
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from prunebench.api.errors import ConfigError
from prunebench.models.checks import stated_config
from prunebench.tracking.status import NOT_FOUND
from prunebench.tracking.store import missing_store, tracking_uri

# what the rebuilt model must share with the run's, exactly (counts, and a ratio of counts)
SAME = ("params/total", "params/nonzero", "sparsity/actual")


def run_config(client: MlflowClient, run_id: str):
    with tempfile.TemporaryDirectory() as tmp:
        return OmegaConf.load(client.download_artifacts(run_id, "config.yaml", tmp))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prunebench-export", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_id", help="the MLflow run whose pruned model to write")
    parser.add_argument("--dir", default=None,
                        help="write to DIR/<run id> and tag the run with the path (for large models); default: "
                             "an MLflow logged model of the run")
    parser.add_argument("--padded", action="store_true",
                        help="layers of different widths padded with zeros to one stock shape, which plain "
                             "from_pretrained loads (export.padded=true); default: each at its own widths")
    parser.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    args = parser.parse_args(argv)
    from prunebench.export.folder import HFFolder
    from prunebench.export.logged_model import EXPORT_TAG, export_folder, export_model
    from prunebench.pruning import prune
    from prunebench.models.introspection import count_parameters
    from prunebench.tracking.run_key import is_dense, recovering

    uri = tracking_uri(args.tracking_uri)
    if (missing := missing_store(uri)) is not None:  # MLflow would make an empty store there
        print(f"prunebench-export: {missing}", file=sys.stderr)
        return NOT_FOUND
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    try:
        run = client.get_run(args.run_id)
        cfg = run_config(client, args.run_id)
    except (MlflowException, OSError) as err:
        print(f"prunebench-export: no prunebench run {args.run_id!r} with a config.yaml in "
              f"{mlflow.get_tracking_uri()}: {err}", file=sys.stderr)
        return 2
    if recovering(cfg) and not is_dense(cfg):
        exported = run.data.tags.get(EXPORT_TAG)
        ran = (f"its recovered model (merged and masked, as evaluated) was exported when it ran: {exported}" if exported
               else "it was run without an export; rerun the job with export=hf (and tracking.skip_existing=false)")
        print(f"prunebench-export: run {args.run_id} recovered its model by fine-tuning (recovery={cfg.recovery.name}), "
              f"which a rebuild from the score cache does not repeat; {ran}", file=sys.stderr)
        return 2
    try:
        writer = HFFolder(dir=args.dir, padded=args.padded)
        writer.check(cfg, get_class(cfg.pruner._target_))
        # the run's model as it named it: a checkpoint folder since deleted was taken for a hub id
        stated_config(cfg.model)
        if args.dir:
            export_folder(args.dir, args.run_id)  # before the model is rebuilt
    except (ConfigError, ValueError) as err:
        print(f"prunebench-export: run {args.run_id}: {err}", file=sys.stderr)
        return 2
    loaded, _, stats, before = prune(cfg, is_dense(cfg), writer)
    rebuilt = {**stats, "params/total": float(count_parameters(loaded.model)),
               "params/nonzero": float(count_parameters(loaded.model, nonzero=True))}
    differ = [f"{key}: run {run.data.metrics[key]}, rebuilt {rebuilt[key]}"
              for key in SAME if key in run.data.metrics and run.data.metrics[key] != rebuilt[key]]
    if differ:
        print(f"prunebench-export: the rebuilt model is not the one run {args.run_id} evaluated ({'; '.join(differ)}); "
              f"nothing written. Rerun the job with export=hf instead", file=sys.stderr)
        return 1
    print(export_model(cfg, writer, loaded, stats, before, args.run_id))
    return 0


if __name__ == "__main__":
    sys.exit(main())
