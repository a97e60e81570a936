"""A lab's own prunebench additions, found through Hydra's search path: hydra.searchpath=[pkg://mylab.conf]."""
