# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test venv bench docs clean device-toolchain

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev,flower]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/bpfree demo

test: $(STAMP)
	$(BIN)/python -m pytest

# The cortex-m7 target of bpfree.device (cross compiler, newlib, QEMU); Debian packages.
# Without them the cortex-m7 tests skip, naming the missing tool.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
device-toolchain:
	$(SUDO) apt-get update
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
	    gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm

# Quick benchmarks, then regenerate docs/BENCHMARKS.md from results/*.json.
bench: $(STAMP)
	$(BIN)/bpfree bench throughput --quick --json results/throughput.json
	$(BIN)/bpfree docs

docs: $(STAMP)
	$(BIN)/bpfree docs

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
