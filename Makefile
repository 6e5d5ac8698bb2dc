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

.PHONY: run test lint bench ts-generate ts-build
run: $(VENV)/.installed
	$(VENV)/bin/threadline serve

# The JavaScript client libraries the e2e tests drive (@ag-ui/client, ai), pinned by the lockfile.
tests/js/node_modules/.installed: tests/js/package-lock.json
	npm ci --prefix tests/js --no-audit --no-fund --loglevel=error
	touch $@

# The TypeScript client's compiler, bundler and test dependencies, pinned by its lockfile.
clients/typescript/node_modules/.installed: clients/typescript/package-lock.json
	npm ci --prefix clients/typescript --no-audit --no-fund --loglevel=error
	touch $@

# Regenerate the client's protocol types and routes from the wire models and the command table,
# and rebuild the page's bundle of the client core (both committed; tests check they are fresh).
ts-generate: $(VENV)/.installed clients/typescript/node_modules/.installed
	mkdir -p build
	$(VENV)/bin/python scripts/ts_protocol.py build/ts-protocol.json
	cd clients/typescript && node scripts/generate.mjs ../../build/ts-protocol.json src/generated

ts-build: clients/typescript/node_modules/.installed
	cd clients/typescript && node scripts/build-static.mjs

# Node 20 that ensure-services.sh put in .tools/ when the system's node is older. That node
# has its own CA list: give it the system's too (what apt and pip trust here).
test: export PATH := $(CURDIR)/.tools/node/bin:$(PATH)
test: export NODE_EXTRA_CA_CERTS ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
test: $(VENV)/.installed
	bash scripts/ensure-services.sh
	$(MAKE) tests/js/node_modules/.installed
	$(MAKE) clients/typescript/node_modules/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(VENV)/.installed
	$(VENV)/bin/python bench/runtime_bench.py
	$(VENV)/bin/python bench/fanout.py
