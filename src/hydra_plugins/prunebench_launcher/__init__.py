"""prunebench's Hydra launcher: hydra-submitit-launcher's SLURM launcher that can submit and return
(Hydra loads launchers only from the hydra_plugins namespace)."""
