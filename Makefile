# Two entry points for people: `make demo` and `make test`. Everything else is plumbing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench-scale clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpuroute sim

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench-scale: $(STAMP)
	$(BIN)/gpuroute sim --scenario bench/scenarios/scale-1m.toml --json out/scale-1m.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
