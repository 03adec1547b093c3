# Two entry points for users: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export TF_CPP_MIN_LOG_LEVEL ?= 2
export KERAS_BACKEND := tensorflow

.PHONY: demo test test-fast test-recipes venv clean c-client

$(VENV)/.installed: requirements.txt requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-test.txt
	touch $@

venv: $(VENV)/.installed

demo: venv
	bash data/demo.sh

# One process per core; worksteal gives each a share of the tests and moves tests from the
# busier to the idle one, so both end together without an ordering list. Session fixtures
# are built once for both (tests/run_cache_fixtures.py).
PYTEST := $(PY) -m pytest -q -n 2 --dist worksteal

test: venv
	$(PYTEST) -m "not recipes" tests

test-fast: venv
	$(PYTEST) -m "not slow and not recipes" tests

# The four WMT14 recipes trained, averaged, translated, evaluated and exported on TFDS mock
# data, at a tiny width and at their own sizes (tens of minutes on a CPU).
test-recipes: venv
	$(PY) -m pytest -q -m recipes tests/test_recipes.py

# The C API client of an export (export/serving/c_client), built against the tensorflow wheel.
c-client: venv
	$(MAKE) -C export/serving/c_client PY=$(abspath $(PY))

clean:
	rm -rf $(VENV) runs
