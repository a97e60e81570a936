#!/usr/bin/env bash
# One command on a lent GPU machine with only the repo: build the venv if needed, print the table.
set -euo pipefail
cd "$(dirname "$0")/.."
make install >/dev/null
timeout 300 .venv/bin/python scripts/gpu_latency.py "$@"
