# Two commands on a fresh machine (only Python 3.10+ needed):
#   make run    set up, analyze the bundled sample trace, predict, open the dashboard
#   make test   set up, lint (ruff, mypy), run the test suite
#   make lint   ruff and mypy only
#   make test-fast  the suite without the tests marked slow (subprocesses, browsers, the whole shared corpus)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WHATIF := $(VENV)/bin/whatif
SAMPLE ?= sample_traces/llm_serve
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint setup bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned: any other spec downloads a multi-GB CUDA build on this project's machines
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev,record,ui]"
	touch $(STAMP)

setup: $(STAMP)

SCENARIOS ?= scenarios/faster_linear.toml scenarios/no_kv_index_copy.toml

run: $(STAMP)
	$(WHATIF) analyze $(SAMPLE)
	$(WHATIF) predict $(SAMPLE) $(addprefix -s ,$(SCENARIOS))
	$(WHATIF) dashboard $(SAMPLE)

# ruff, then mypy through tools/typecheck.py (it checks the folders under their installed whatif.* names)
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) tools/typecheck.py

test: lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

# Leaves out @pytest.mark.slow: recordings and CLI runs in subprocesses, the browser tests.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache
