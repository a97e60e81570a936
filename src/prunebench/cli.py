"""Entry points. The Hydra app is thin: compose, then hand the config to job.run."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from prunebench import collector

# a SLURM, submitit or joblib job imports this module as it unpickles its task function, before any
# prunebench code runs: the libraries load without collection passes here too (0.3-0.5 CPU s less a job)
with collector.importing():
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import DictConfig, OmegaConf

    from prunebench.groups import listing, retired_spelling
    from prunebench.paths import CONF_DIR
    from prunebench.plan import format_plan, plan
    from prunebench.tracking import interrupts, server, store
    from prunebench.tracking.sweep import PARENT_ENV, job_state

log = logging.getLogger("prunebench")
# the help template passes ${hydra.searchpath}: options a lab keeps in its own package are listed too
OmegaConf.register_new_resolver("prunebench_config_groups", lambda searchpath=(): listing(tuple(searchpath)),
                                replace=True)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    from prunebench.job import run
    from prunebench.startup import quiet_libraries
    from prunebench.api.errors import ConfigError, refuse

    quiet_libraries()
    # again inside the job: submitit (hydra/launcher=submitit_*) sets SIGTERM aside when a job starts
    end_runs_on_sigterm()
    overrides = list(HydraConfig.get().overrides.task)
    if cfg.get("plan"):  # one job's plan (a sweep's is its callback's, before any job launches)
        print(format_plan(plan([overrides], lambda _: cfg), " ".join(overrides)))
        return
    try:
        parent = os.environ.get(PARENT_ENV)
        if parent is None:
            run(cfg, overrides)
        else:  # the job's state on its sweep's parent (prunebench-status), and a detached sweep's closing
            server.export_http_settings(cfg.tracking)
            with job_state(store.tracking_uri(cfg.tracking.uri), parent, HydraConfig.get().job.num,
                           " ".join(overrides), cfg.tracking.claim.stale_s) as end:
                end.skipped = run(cfg, overrides, parent) is None
    except ConfigError as err:
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            refuse(err)
        log.error("invalid config: %s", err)
        # in a sweep Hydra's launcher keeps it as the job's failure and the sweep goes on (SystemExit would stop it)
        raise ConfigError(str(err)) from None
    except Exception as err:
        if cfg.fail_fast:  # Hydra's launcher catches Exception per job; SystemExit stops the sweep
            raise SystemExit(f"prunebench: stopping the sweep (fail_fast=true): {err}") from err
        raise


def end_runs_on_sigterm() -> None:
    """SIGTERM (scancel, a requeue, a preemption, a killed make) unwinds like Ctrl-C: the open run
    ends KILLED at once instead of waiting RUNNING for SIGKILL. Nothing is saved on the way out, which
    is why submitit's choice of ignoring SIGTERM is undone here: an evaluation's next attempt starts
    over, and a recovery fine-tune resumes from the checkpoint it wrote last while training."""
    if threading.current_thread() is threading.main_thread():  # the only thread a handler can be set from
        signal.signal(signal.SIGTERM, exit_outside_the_store)
    interrupts.install()


def exit_outside_the_store(signum: int, frame) -> None:
    """The SIGTERM handler: exits, unless the main thread is inside the store's code (`interrupts.deferred`)."""
    if not interrupts.deferred(signum, frame):
        sys.exit(128 + signum)


def main() -> None:
    refuse_retired(sys.argv[1:])
    end_runs_on_sigterm()
    app()


def refuse_retired(arguments: list[str]) -> None:
    """An override in a spelling that is gone (`export=true` before export became a group,
    `task_library@...` before each benchmark was one task option) is refused in one line naming the
    new one, before Hydra composes anything: its own messages name neither."""
    from prunebench.api.errors import refuse
    from prunebench.export.writer import moved

    message = moved(arguments) or next((m for a in arguments if (m := retired_spelling(a)) is not None), None)
    if message is not None:
        refuse(message)


def plan_main(argv: list[str] | None = None) -> int:
    """prunebench-plan [OVERRIDES]: `prunebench -m OVERRIDES plan=true`, the same sweeper expanding
    the same grid (e.g. experiment=mop_llama2, pruner='glob(w*)'); lists every job, runs none."""
    arguments = [a for a in (sys.argv[1:] if argv is None else argv) if a not in ("-m", "--multirun")]
    if {"-h", "--help"} & set(arguments):
        print(plan_main.__doc__ + "\n")
        return run_app(["prunebench-plan", "--help", *[a for a in arguments if a.startswith("hydra.")]])
    return run_app(["prunebench-plan", "-m", *[a for a in arguments if not a.startswith("plan=")], "plan=true"])


def run_app(argv: list[str]) -> int:
    """The Hydra app on the command line `argv`, in this process."""
    from hydra.core.global_hydra import GlobalHydra

    argv, sys.argv = list(sys.argv), argv
    handlers, level = list(logging.root.handlers), logging.root.level  # Hydra configures the root logger
    try:
        refuse_retired(sys.argv[1:])
        app()
    except SystemExit as end:  # the plan's status, from the sweep callback, or a refusal
        return end.code if isinstance(end.code, int) else 1 if end.code else 0
    finally:  # as it was: a caller in the same process may compose, plan or log again
        sys.argv = argv
        GlobalHydra.instance().clear()
        logging.root.handlers[:] = handlers
        logging.root.setLevel(level)
    return 0
