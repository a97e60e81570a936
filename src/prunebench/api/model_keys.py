"""Model-config keys that describe a model for planning (`prunebench-plan`'s cost classes) and are
no loader's argument: the loader drops them, and run keys ignore them."""

PLANNING_KEYS = ("params_b",)
