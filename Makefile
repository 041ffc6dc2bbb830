# Set-up and everyday targets. Each target installs what it needs into .venv first.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-dev

.PHONY: setup demo test test-quick test-fast bench clean repro-env

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@# a bare "torch" would pull a multi-GB CUDA build: take the CPU wheel when none is present
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	@$(PY) -m pip install -q -e ".[dev]"
	@touch $(STAMP)

# the tests also cover the Ray executor and the Flower deployment: install those extras too
FULL_STAMP := $(VENV)/.installed-full
$(FULL_STAMP): $(STAMP)
	@$(PY) -m pip install -q -e ".[dev,ray,flower]"
	@touch $(FULL_STAMP)

setup: $(STAMP)

## make demo: FedGMR vs FedAvg vs FedGMR w/o GMR on digits; prints the compare table, writes demo-out/
demo: $(STAMP)
	$(VENV)/bin/fedgmr demo --out demo-out

## make test: the whole test suite, the tests marked slow included: what CI runs (.ci/run)
## (integration tests on ../shared/data skip when it is absent)
## --dist worksteal: a worker that runs out of tests takes half of the other's queue, so the
## long end-to-end tests do not leave one core idle at the end (xdist's default hands out
## fixed chunks in collection order)
test: $(FULL_STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pytest -q -n 2 --dist worksteal --durations=10

## make test-quick: the inner development loop: every test but those marked slow (-m "not slow")
test-quick: $(FULL_STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pytest -q -n 2 --dist worksteal -m "not slow"

## make test-fast: without the Ray and Flower extras: the suite less tests/distributed
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal --ignore=tests/distributed

## make repro-env: the pinned numeric stack of the measured tables (constraints/repro.txt) in .venv-repro;
## reproduce a cell there with the kernel limits of constraints/repro.env (docs/protocol.md)
REPRO ?= .venv-repro
repro-env:
	@test -x $(REPRO)/bin/python || $(PYTHON) -m venv $(REPRO)
	@$(REPRO)/bin/python -m pip install -q --upgrade pip
	@$(REPRO)/bin/python -m pip install -q torch==2.13.0 -c constraints/repro.txt
	@$(REPRO)/bin/python -m pip install -q -c constraints/repro.txt -e .
	@$(REPRO)/bin/python -m pip check
	@echo "pinned stack in $(REPRO): run cells as  set -a; . constraints/repro.env; set +a; $(REPRO)/bin/fedgmr ..."

bench: $(STAMP)
	$(PY) benchmarks/sim_overhead.py

clean:
	rm -rf $(VENV) $(REPRO) demo-out .pytest_cache
