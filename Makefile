# One-command set-up, run and test. Everything installs from this repository's own files.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install test test-fast test-profile lint devnet down compile bench clean toploc-ref docker images compose-env browser bench-tools gpu-wheels hosts k8s-tools vllm images-vllm

install: ## virtualenv + pinned Python deps + pinned chain tooling (anvil, solcjs, OpenZeppelin)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	$(BIN)/pip install --quiet --no-deps -e examples/arith  # the third workload: a package of its own (docs/workloads.md)
	npm ci --no-audit --no-fund --loglevel=error
	$(MAKE) --no-print-directory toploc-ref

toploc-ref: ## reference TOPLOC built from source against the pinned torch (interop tests, bench)
	$(BIN)/python -c "import toploc" 2>/dev/null || \
	  $(BIN)/pip install --quiet --no-build-isolation --no-deps --no-binary toploc toploc==0.1.6

VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
# a GPU host: make vllm VLLM_LOCK=requirements-vllm-cuda.lock (the CUDA build; docs/performance.md)
VLLM_LOCK ?= requirements-vllm.lock

vllm: ## vLLM's CPU build in its own environment (.venv-vllm, requirements-vllm.lock, --no-deps: no CUDA-linked extras) beside the project's package (editable); prints its time and size
	@started=$$(date +%s); \
	(test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)) && \
	(cmp -s $(VLLM_LOCK) $(VLLM_VENV)/installed.lock || \
	 ($(VLLM_BIN)/pip install --quiet --upgrade pip && \
	  $(VLLM_BIN)/pip install --quiet --no-deps -r $(VLLM_LOCK) && \
	  $(VLLM_BIN)/pip install --quiet --no-deps -e . && \
	  cp $(VLLM_LOCK) $(VLLM_VENV)/installed.lock)) && \
	$(VLLM_BIN)/python -c "import sys; from workloads.model.vllm_internals import main; sys.exit(main())" && \
	echo "vllm: $(VLLM_VENV) ready in $$(( $$(date +%s) - started )) s, $$(du -sh $(VLLM_VENV) | cut -f1)"

docker: ## a Docker engine (apt docker.io + dockerd) and the local test image, built without a registry
	scripts/ci-docker.sh

browser: ## Debian chromium + chromedriver for the dashboard's browser test (apt)
	scripts/install-browser.sh

hosts: ## iproute2 and nftables (Debian) for `intellect devnet up --hosts` (network namespaces, NAT, cut links; root)
	command -v ip >/dev/null || [ -x /usr/sbin/ip ] || \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends iproute2)
	command -v nft >/dev/null || [ -x /usr/sbin/nft ] || \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nftables)

bench-tools: ## HAProxy and PostgreSQL (Debian) for bench/heartbeats.py --replicas 2 (apt)
	command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends haproxy)
	bash scripts/ci-services.sh

K8S_VENV := .venv-k8s

k8s-tools: ## the Kubernetes chart's offline checkers in .venv-k8s (deploy/requirements.lock: Helm's SDK, kubernetes-validate, checkov; PyPI only)
	test -x $(K8S_VENV)/bin/python || $(PY) -m venv $(K8S_VENV)
	cmp -s deploy/requirements.lock $(K8S_VENV)/installed.lock || \
	  ($(K8S_VENV)/bin/pip install --quiet --no-compile --no-deps -r deploy/requirements.lock && \
	   cp deploy/requirements.lock $(K8S_VENV)/installed.lock)

images: ## the RL images (runtime, workload, service) built offline; cached by content hash
	images/build-rl.sh

images-vllm: ## the inference workload image with vLLM's CPU build (intellect-workload-vllm) for `--runtime docker --backend vllm`: its vLLM layer once per lock, the app on top; offline
	images/build-vllm.sh

compose-env: ## compose.env for docker-compose.yml: a fresh chain mnemonic, role keys, ports (never committed)
	$(BIN)/intellect compose env --out compose.env

test: ## lint, then the full suite (its own anvil, Redis, servers; on 3 pytest-xdist workers, TEST_WORKERS=0 for one process); ends with its wall time against the 25 min budget
	scripts/timed-tests.sh

test-profile: ## the full suite with the 60 most expensive items (tests and fixture set-ups) printed, record in .test-profile.json; refreshes tests/durations.json (the order workers take modules in)
	scripts/timed-tests.sh --profile-top 60
	$(BIN)/python -m tests.support.timing .test-profile.json --write-durations tests/durations.json --top 0

test-fast: ## pure functions and in-process apps over one Redis: no chain, no containers (< 60 s)
	$(BIN)/pytest -q -m "not slow" -p no:cacheprovider

lint: ## ruff check + mypy (strict on intellect/, the stores, the routes and the modules listed in pyproject) + import-linter's layer contracts (pyproject.toml) + no product function over 80 lines (scripts/function_length.py)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo --no-cache
	$(BIN)/python scripts/function_length.py

devnet: ## the main job: a whole decentralized RL run on this machine (reward rising, a cheater slashed)
	$(BIN)/intellect devnet up --demo

down:
	$(BIN)/intellect devnet down

compile: ## recompile the contracts with the pinned solcjs and refresh the committed artifacts
	node contracts/compile.js

# What bench/gpu imports beyond a lent GPU machine's torch stack (torch, transformers, numpy, safetensors,
# pyarrow, tokenizers, rich): pydantic and what it needs, structlog, and py_ecc (imported by `intellect`
# for its side effect). Versions are the lock file's.
GPU_WHEEL_NAMES := pydantic pydantic_core pydantic-settings annotated-types typing-inspection \
	typing_extensions python-dotenv structlog py-ecc
GPU_WHEELS = $(foreach n,$(GPU_WHEEL_NAMES),$(shell grep -i -m1 '^$(n)==' requirements.lock))

gpu-wheels: ## the wheels bench/gpu/run.sh installs on a lent GPU machine (Python 3.12, offline) into .whl/
	@test $(words $(GPU_WHEELS)) -eq $(words $(GPU_WHEEL_NAMES)) || \
	  (echo "requirements.lock lacks one of: $(GPU_WHEEL_NAMES)"; exit 1)
	rm -rf .whl && mkdir -p .whl
	python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl $(GPU_WHEELS)
	@du -sh .whl && ls .whl

bench:
	$(BIN)/python bench/gas.py
	$(BIN)/python bench/toploc.py --quick
	$(BIN)/python bench/inference.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(K8S_VENV) node_modules .pytest_cache .ruff_cache
