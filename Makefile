# The two commands a fresh Debian machine needs: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Real tools the integration tests run against the simulator (Debian bookworm package names).
DEBIAN_TEST_PACKAGES := librocm-smi64-1 rocm-smi prometheus-node-exporter prometheus \
	prometheus-alertmanager systemd util-linux procps python3-venv curl openssl strace
DEBIAN_BENCH_PACKAGES := wrk strace
LISTEN ?= 127.0.0.1:9442

.PHONY: demo demo-stack test lint typecheck unit integration bench debian-test-packages debian-bench-packages clean

$(BIN)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || \
		{ rm -rf $(VENV); ./.ci/install-debian-packages python3-venv && $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@

demo: $(BIN)/.installed
	@echo "amdgpu-exporter demo: a simulated node (4 x MI250X = 8 GCDs) on http://$(LISTEN)/"
	@echo "  metrics: http://$(LISTEN)/metrics   devices: http://$(LISTEN)/api/v1/devices   alerts: http://$(LISTEN)/api/v1/alerts"
	$(BIN)/amdgpu-exporter --demo --web.listen-address=$(LISTEN) $(ARGS)

# The demo exporter beside Debian's Prometheus and Alertmanager, pages printed in the terminal; Ctrl-C stops all.
# ARGS='--fast' pages within ~30 s instead of ~2 min (see deploy/demo/demo_stack.py --help).
demo-stack: $(BIN)/.installed
	@./.ci/install-debian-packages prometheus prometheus-alertmanager
	$(BIN)/python deploy/demo/demo_stack.py $(ARGS)

debian-test-packages:
	@./.ci/install-debian-packages $(DEBIAN_TEST_PACKAGES)

debian-bench-packages:
	@./.ci/install-debian-packages $(DEBIAN_BENCH_PACKAGES)

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/.installed
	$(BIN)/mypy

test: $(BIN)/.installed debian-test-packages lint typecheck
	$(BIN)/pytest $(PYTEST_ARGS)

unit: $(BIN)/.installed
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

bench: $(BIN)/.installed debian-test-packages debian-bench-packages
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build *.egg-info
