# The two commands of the README's quick start: `make demo` and `make test`.
# Each creates .venv when needed and installs the project into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dcjax-installed
EXTRAS ?= test,video,notebooks,pretrained,skvideo

.PHONY: demo test lint bench install clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "dcjax needs Python >= 3.10"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m dcjax demo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile tests

lint: $(STAMP)
	$(PY) -m ruff check dcjax tests
	$(PY) -m ruff format --check dcjax tests

bench: $(STAMP)
	$(PY) -m dcjax bench --json bench-results/bench.json --report bench-results/report.html

clean:
	rm -rf $(VENV) dcjax-demo .pytest_cache
