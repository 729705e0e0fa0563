# balcaprl — set-up and everyday commands. Every target sets up .venv first (idempotent).
# CPU machines: torch is pinned to the local CPU build (2.13.0) *before* anything else is
# installed, so no dependency can pull the multi-GB CUDA wheels. On GPU machines, install your
# CUDA torch first and `pip install -e ".[trl]"` yourself, or run `make TORCH_SPEC=torch setup`.

PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS     ?= dev,trl
PY          = $(VENV)/bin/python
STAMP       = $(VENV)/.balcaprl-installed

.PHONY: setup test demo bench lint figure clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@touch $@

test: setup
	$(PY) -m pytest -q

# Until the demo (issue 5) lands, the offline main job is the paper's Figure 2, computed with the
# library's own advantage functions.
demo: setup
	$(VENV)/bin/balcaprl figure advantage-collapse --out runs/demo

bench: setup
	$(PY) benchmarks/bench_advantages.py
	@for b in benchmarks/bench_*.py; do [ "$$b" = benchmarks/bench_advantages.py ] || $(PY) $$b; done

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .hypothesis
