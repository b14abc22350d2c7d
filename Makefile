# Two commands to start: `make demo` and `make test`. Both create .venv on first use.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=
MLFLOW_PORT ?= 5000

.PHONY: help install demo test test-fast test-long lint bench bench-all mlflow-ui device-pack clean

help:
	@echo "make demo       train the default config (digits, 2 DDP workers) on an embedded local Ray"
	@echo "make test       the whole test suite (unit, distributed, cluster, e2e)"
	@echo "make test-fast  unit tests, in-process only (not slow, no subprocess; < 1 min)"
	@echo "make test-long  the longer variants left out of make test (two more fault-campaign seeds, the three-fault bitwise run, FSDP 2->1, streamed and token-shard resizes, a data set 4x the object store, an elastic trial growing, more host faults)"
	@echo "make lint       ruff, import-linter contracts (pyproject.toml), hadolint"
	@echo "make bench      engine overhead vs plain PyTorch (JSON, ~2 min)"
	@echo "make bench-all  + recovery (~3 min) and ASHA vs grid sweep cost (~12 min)"
	@echo "make device-pack  wheels a bare GPU machine lacks (Ray without Java, pydantic...) -> dist/device (docs/gpu.md)"
	@echo "make mlflow-ui  the MLflow UI on the store the runs use (\$$ELASTIC_TRAIN_HOME, else here), port $(MLFLOW_PORT)"

# The venv is rebuilt when the dependency files change. scripts/install.sh is the same recipe the
# Dockerfile runs: torch==2.13.0 first (the CPU wheel on disk here), then the project under constraints.txt.
$(STAMP): pyproject.toml constraints.txt scripts/install.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	scripts/install.sh $(PY) dev
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m jobs.train --config configs/digits.yaml --summary-json results/demo-summary.json

test: $(STAMP)
	$(PY) -m pytest -m "not long" --durations=25 $(PYTEST_ARGS)

test-long: $(STAMP)
	$(PY) -m pytest -m long --durations=25 $(PYTEST_ARGS)

# Unit tests that run in this process and in seconds; the `slow` (torch.compile, timings) and `subprocess`
# (real `python -m jobs.*`) ones run in `make test`.
test-fast: $(STAMP)
	$(PY) -m pytest tests/unit -m "not slow and not subprocess and not long" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/hadolint Dockerfile

bench: $(STAMP)
	$(PY) bench/overhead.py

bench-all: bench
	$(PY) bench/recovery.py
	$(PY) bench/sweep_cost.py

mlflow-ui: $(STAMP)
	$(PY) -m jobs.mlflow_ui --port $(MLFLOW_PORT)

# Needs network (pip download); PYTHON_VERSION=3.11 packs for another Python. bench/gpu_ray.py installs the result.
device-pack:
	scripts/device-pack.sh

clean:
	rm -rf results mlflow.db mlartifacts .pytest_cache
