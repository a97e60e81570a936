"""Judges: models that grade a generated answer (LLaVA-Bench's GPT-4 review, MM-Vet's grader).
A task holds one, injected from `judge=` by Hydra, so tasks never import this package."""
