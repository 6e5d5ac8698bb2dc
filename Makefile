# Two entry points (see README.md): `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
# Extra pytest arguments, e.g. a reduced selection: make test PYTEST_ARGS='tests/unit -x'
PYTEST_ARGS ?=

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

.PHONY: run test lint bench
run: $(VENV)/.installed
	$(VENV)/bin/threadline serve

# The JavaScript client libraries the e2e tests drive (@ag-ui/client, ai), pinned by the lockfile.
tests/js/node_modules/.installed: tests/js/package-lock.json
	npm ci --prefix tests/js --no-audit --no-fund --loglevel=error
	touch $@

# Node 20 that ensure-services.sh put in .tools/ when the system's node is older. That node
# has its own CA list: give it the system's too (what apt and pip trust here).
test: export PATH := $(CURDIR)/.tools/node/bin:$(PATH)
test: export NODE_EXTRA_CA_CERTS ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
test: $(VENV)/.installed
	bash scripts/ensure-services.sh
	$(MAKE) tests/js/node_modules/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(VENV)/.installed
	$(VENV)/bin/python bench/runtime_bench.py
	$(VENV)/bin/python bench/fanout.py
