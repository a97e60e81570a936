"""Where a pruned model goes (docs/export.md): `writer.py` is what an export format is (`export=<name>`
chooses one, `conf/export/<name>.yaml` naming its class), `folder.py` the Hugging Face folder
(`export=hf`, each layer at its own widths, loaded without remote code), `logged_model.py` puts the
folder a writer filled in MLflow (a logged model of the run) or in `export.dir`, and `cli.py` is
`prunebench-export RUN_ID`, the same model rebuilt from a finished run."""
