# One-command set-up, run and test. Everything installs from this repository's own files.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install test lint devnet down compile bench clean toploc-ref docker

install: ## virtualenv + pinned Python deps + pinned chain tooling (anvil, solcjs, OpenZeppelin)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	npm ci --no-audit --no-fund --loglevel=error
	$(MAKE) --no-print-directory toploc-ref

toploc-ref: ## reference TOPLOC built from source against the pinned torch (interop tests, bench)
	$(BIN)/python -c "import toploc" 2>/dev/null || \
	  $(BIN)/pip install --quiet --no-build-isolation --no-deps --no-binary toploc toploc==0.1.6

docker: ## a Docker engine (apt docker.io + dockerd) and the local test image, built without a registry
	scripts/ci-docker.sh

test: ## the full test suite (starts its own anvil, Redis and servers)
	$(BIN)/ruff check .
	$(BIN)/pytest

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

devnet: ## the local network on embedded defaults
	$(BIN)/intellect devnet up

down:
	$(BIN)/intellect devnet down

compile: ## recompile the contracts with the pinned solcjs and refresh the committed artifacts
	node contracts/compile.js

bench:
	$(BIN)/python bench/gas.py
	$(BIN)/python bench/toploc.py --quick
	$(BIN)/python bench/inference.py

clean:
	rm -rf $(VENV) node_modules .pytest_cache .ruff_cache
