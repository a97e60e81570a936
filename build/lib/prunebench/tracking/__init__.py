"""MLflow lifecycle, run identity and stability."""
