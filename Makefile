# Two entry points: `make demo` and `make test`. Each creates .venv on first use, from the lock.
# PYTHON: the first of python3.11, python3.12, python3.13 that runs here (or `make PYTHON=/path/to/python`).
PYTHON ?= $(shell for p in python3.11 python3.12 python3.13 python3; do \
	  $$p -c 'import sys; assert (3, 11) <= sys.version_info[:2] <= (3, 13)' 2>/dev/null && { echo $$p; break; }; done)
VENV := .venv
STAMP := $(VENV)/.installed
# the exact tested set (requirements/lock.txt) and the tested torch (requirements/torch.txt)
LOCK := -c requirements/lock.txt -c requirements/torch.txt

.PHONY: demo test test-fast test-tiers test-busy gpu-check bench lock clean

$(STAMP): pyproject.toml requirements/lock.txt requirements/torch.txt
	@test -n "$(PYTHON)" || { echo "error: no Python 3.11-3.13 found (make PYTHON=/path/to/python3.X)"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet $(LOCK) -e '.[all,test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/muonlab demo

# Every test process imports muonlab (the suite starts ~130: runs, ranks, SLURM jobs): its bytecode is written first,
# as an interpreter would on first import unless PYTHONDONTWRITEBYTECODE is set (then each compiled it again, ~0.3 s)
BYTECODE := $(VENV)/bin/python -m compileall -q src
# pytest keeps the test modules it rewrote (their asserts) only where bytecode may be written: with
# PYTHONDONTWRITEBYTECODE set, each worker rewrote all of them on every run (10 of its 23 s of collection)
PYTEST := env PYTHONDONTWRITEBYTECODE= $(VENV)/bin/python -m pytest

# the whole suite, one worker per core (pytest-xdist; a file to a worker, so a module fixture is built once, or a
# test to a worker in a file marked spread: tests/support/scheduling.py); GPU tests skip without CUDA
test: $(STAMP)
	$(BYTECODE)
	$(PYTEST) -q -n auto --dist loadfile

# the suite less the slow, multi-process and SLURM tiers (about a minute on 2 cores; gpu tests skip without CUDA)
test-fast: $(STAMP)
	$(BYTECODE)
	$(PYTEST) -q -n auto --dist loadfile -m "not slow and not multiprocess and not slurm"

# the whole suite, recording each test's tier from what it did (tests/suite/tiers.json, tests/support/tiers.py):
# run it when a test changes tier (the session that sees a test trained or started a process outside its tier says so)
test-tiers: $(STAMP)
	$(BYTECODE)
	MUONLAB_TEST_TIERS=write $(PYTEST) -q -n auto --dist loadfile

# the whole suite beside four CPU-bound processes (a laptop busy with other work): it must pass so, only slower
test-busy: $(STAMP)
	$(BYTECODE)
	$(VENV)/bin/python tests/support/cpu_hogs.py 4 -- $(PYTEST) -q -n auto --dist loadfile

# every CUDA path on this machine's GPU in about 8 minutes: writes gpu_check.json (nothing without CUDA)
gpu-check: $(STAMP)
	$(VENV)/bin/muonlab doctor --gpu

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/step_throughput.py

# rewrite the lock from .venv once the suite passed in it (torch and what only torch needs go to torch.txt)
lock: $(STAMP)
	$(VENV)/bin/python requirements/write_lock.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
