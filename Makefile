# Two commands to start: `make demo` and `make test`. Both create .venv on first use.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=
MLFLOW_PORT ?= 5000
# Match a cluster: `make install RAY_VERSION=2.57.1 MLFLOW_VERSION=3.10.1` (inside pyproject.toml's ranges).
RAY_VERSION ?=
MLFLOW_VERSION ?=
CONSTRAINTS ?= constraints.txt
# The focused version checks (pytest marker `versions`): the canary, a killed worker ending bitwise, an ASHA sweep,
# a job submitted to a `ray start --head` head tracking to a real `mlflow server`, the demo.
VERSIONS_ARGS ?= -m versions

.PHONY: help install demo test test-fast test-long test-versions test-oldest test-public lint bench bench-all \
	mlflow-ui device-pack clean

help:
	@echo "make demo       train the default config (digits, 2 DDP workers) on an embedded local Ray"
	@echo "make test       the whole test suite (unit, distributed, cluster, e2e)"
	@echo "make test-fast  unit tests, in-process only (not slow, no subprocess; < 1 min)"
	@echo "make test-long  the longer variants left out of make test (two more fault-campaign seeds, the three-fault bitwise run, FSDP 2->1, streamed and token-shard resizes, a data set 4x the object store, an elastic trial growing, more host faults)"
	@echo "make test-versions RAY_VERSION=2.57.1 MLFLOW_VERSION=3.10.1  the focused version checks in a venv of that pair"
	@echo "make test-oldest    the same on the oldest tested set (constraints-oldest.txt); make test-public: newest, internals off"
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

# With RAY_VERSION / MLFLOW_VERSION (a cluster's pair) or CONSTRAINTS, always install: the stamp knows files only.
ifneq ($(RAY_VERSION)$(MLFLOW_VERSION)$(filter-out constraints.txt,$(CONSTRAINTS)),)
install:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	RAY_VERSION=$(RAY_VERSION) MLFLOW_VERSION=$(MLFLOW_VERSION) CONSTRAINTS=$(abspath $(CONSTRAINTS)) \
		scripts/install.sh $(PY) dev
	touch $(STAMP)
else
install: $(STAMP)
endif

demo: $(STAMP)
	$(PY) -m jobs.train --config configs/digits.yaml --summary-json results/demo-summary.json

# Serial: two pytest-xdist workers were slower here (2026-12-07: 33 min against 25), the suite already keeps a
# 2-core box ~70 % busy and every test that starts Ray doubles its start-up under contention. The 25 slowest
# tests are printed at the end; one over 60 s says why in a comment.
test: $(STAMP)
	$(PY) -m pytest -m "not long" --durations=25 $(PYTEST_ARGS)

# Every `long` test; CI runs LONG_MARKS="long and not soak" (the `soak` ones, several minutes each, do not fit its
# 90 minutes beside the rest: the 20-fault hosts campaign, a killed PBT sweep, the device pack's download...).
LONG_MARKS ?= long
test-long: $(STAMP)
	$(PY) -m pytest -m "$(LONG_MARKS)" --durations=25 $(PYTEST_ARGS)

# A venv of its own per pair (.venv-versions/ray-X-mlflow-Y), so .venv stays the newest set.
VERSIONS_VENV = .venv-versions/ray-$(or $(RAY_VERSION),pinned)-mlflow-$(or $(MLFLOW_VERSION),pinned)
test-versions:
	@test -n "$(RAY_VERSION)$(MLFLOW_VERSION)$(filter-out constraints.txt,$(CONSTRAINTS))" || \
		{ echo "usage: make test-versions RAY_VERSION=2.57.1 MLFLOW_VERSION=3.10.1 (or CONSTRAINTS=FILE)"; exit 2; }
	$(MAKE) install VENV=$(VERSIONS_VENV) RAY_VERSION=$(RAY_VERSION) MLFLOW_VERSION=$(MLFLOW_VERSION) \
		CONSTRAINTS=$(CONSTRAINTS)
	$(VERSIONS_VENV)/bin/python -m pytest $(VERSIONS_ARGS) --durations=10 $(PYTEST_ARGS)

test-oldest:
	$(MAKE) test-versions CONSTRAINTS=constraints-oldest.txt RAY_VERSION= MLFLOW_VERSION= \
		VERSIONS_VENV=.venv-versions/oldest

# The newest set with every upstream internal off (compat.internals=off): the public path passes the same checks.
test-public: $(STAMP)
	ELASTIC_TRAIN_INTERNALS=off $(PY) -m pytest $(VERSIONS_ARGS) --durations=10 $(PYTEST_ARGS)

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
	rm -rf results mlflow.db mlartifacts .pytest_cache .venv-versions
