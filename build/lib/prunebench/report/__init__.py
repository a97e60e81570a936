"""Tables and plots over a whole grid of MLflow runs."""
