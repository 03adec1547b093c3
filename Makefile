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

# Three processes on two cores: a test often waits on processes it started; the longest
# files go first (tests/conftest.py) so that the three end together.
test: venv
	$(PY) -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder -m "not recipes" tests

test-fast: venv
	$(PY) -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder -m "not slow and not recipes" tests

# The four WMT14 recipes trained, averaged, translated, evaluated and exported on TFDS mock
# data, at a tiny width and at their own sizes (tens of minutes on a CPU).
test-recipes: venv
	$(PY) -m pytest -q -m recipes tests/test_recipes.py

# The C API client of an export (export/serving/c_client), built against the tensorflow wheel.
c-client: venv
	$(MAKE) -C export/serving/c_client PY=$(abspath $(PY))

clean:
	rm -rf $(VENV) runs
