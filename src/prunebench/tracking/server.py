"""tracking=server: a team's MLflow tracking server over HTTP. MLflow's client already retries
transient failures (urllib3 with backoff, POSTs included) and reads the credentials from the
environment; this module only checks the settings before a job starts and hands them to MLflow
through the environment variables it reads at every request."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from prunebench.api.errors import ConfigError
from prunebench.tracking.store import tracking_uri

# tracking.http.<name> -> the MLflow environment variable, and the values MLflow accepts
HTTP_ENV = {"max_retries": ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", int, 0, 10),
            "backoff_factor": ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", int, 0, 120),
            "backoff_jitter": ("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", float, 0, None),
            "timeout_s": ("MLFLOW_HTTP_REQUEST_TIMEOUT", int, 1, None)}
CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def check(tracking) -> None:
    """A server config names an http(s) server, credentials come in pairs, and the retry settings
    are ones MLflow accepts (it would refuse them only at the first request)."""
    http = tracking.get("http")
    if http is None:
        return
    uri = tracking_uri(tracking.uri)
    if not uri.startswith(("http://", "https://")):
        raise ConfigError(f"tracking=server needs the server's address, got tracking.uri={uri!r}: "
                          f"set tracking.uri=http://host:port (or MLFLOW_TRACKING_URI), or use tracking=local")
    if urlsplit(uri).username is not None:
        raise ConfigError(f"tracking.uri holds a sign-in ({urlsplit(uri).hostname}): the URI is logged with the run's "
                          f"parameters, so give the credentials in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD")
    given = [name for name in CREDENTIALS if os.environ.get(name)]
    if len(given) == 1:
        missing = next(name for name in CREDENTIALS if name not in given)
        raise ConfigError(f"{given[0]} is set but {missing} is not: set both (the server's basic auth) or neither")
    for name, value in http.items():
        if name not in HTTP_ENV:
            raise ConfigError(f"tracking.http.{name} is not a setting; use {sorted(HTTP_ENV)}")
        _, kind, low, high = HTTP_ENV[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)) \
                or value < low or (high is not None and value > high):
            within = f"[{low}, {high}]" if high is not None else f">= {low}"
            raise ConfigError(f"tracking.http.{name}={value!r}: use {'an integer' if kind is int else 'a number'} {within}")


def export_http_settings(tracking) -> None:
    """The config's retry settings win over the same variables in the environment: the config is
    what the run logs as its parameters."""
    for name, value in (tracking.get("http") or {}).items():
        os.environ[HTTP_ENV[name][0]] = str(value)
