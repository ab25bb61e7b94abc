# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test venv bench docs clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/bpfree demo

test: $(STAMP)
	$(BIN)/python -m pytest

# Quick benchmarks, then regenerate docs/BENCHMARKS.md from results/*.json.
bench: $(STAMP)
	$(BIN)/bpfree bench throughput --quick --json results/throughput.json
	$(BIN)/bpfree docs

docs: $(STAMP)
	$(BIN)/bpfree docs

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
