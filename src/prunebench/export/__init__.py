"""Where a pruned model goes (docs/export.md): `folder.py` writes it as a Hugging Face folder (each
layer at its own widths, loaded without remote code), `logged_model.py` puts that folder in MLflow
(a logged model of the run) or in `export_dir`, and `cli.py` is `prunebench-export RUN_ID`, the same
model rebuilt from a finished run."""
