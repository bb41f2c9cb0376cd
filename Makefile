# Two entry points: `make demo` and `make test`. Each creates .venv on first use.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast gpu-check bench clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (muonlab needs Python 3.11)"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/muonlab demo

# the whole suite, one worker per core (pytest-xdist; a file per worker, so a module fixture is built once); GPU tests skip without CUDA
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n auto --dist loadfile

# the suite less the slow and multi-process tests (about a minute on 2 cores)
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n auto --dist loadfile -m "not slow and not multiprocess"

# every CUDA path on this machine's GPU in about 8 minutes: writes gpu_check.json (nothing without CUDA)
gpu-check: $(STAMP)
	$(VENV)/bin/muonlab doctor --gpu

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/step_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
