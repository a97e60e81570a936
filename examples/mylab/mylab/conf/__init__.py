"""Config groups merged into prunebench's (pruner/, task/, experiment/) by hydra.searchpath=[pkg://mylab.conf]."""
