"""Tasks are declarative data (source, prompt, choices, metric); the engine in evaluation/ is generic."""
