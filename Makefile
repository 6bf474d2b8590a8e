# Everyday commands. `make demo` and `make test` set up a fresh machine first (CPU build of torch).
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: setup setup-demo demo test unit lint docs bench-quick bench-defaults gpu-check clean

# What the tests need: the package with the recipes' packages, pytest and ruff, and the benchmarks' (the tests
# compare against the FlexDeMo authors' package, detonation).
setup:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[test,bench]"

# What the demo needs: the package and the recipes' packages (datasets, evaluate and the metrics), nothing else.
setup-demo:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[recipes]"

# The T5 translation recipe on its embedded default, on CPU, simulating 2 nodes x 2 processes (about 2 minutes on
# 2 cores once installed; it ends with a summary: losses, BLEU/chrF, inter-node bytes, where the model was saved).
demo: setup-demo
	$(PYTHON) -m accelerate.commands.launch --config_file accelerate_configs/cpu_2x2.yaml \
		recipes/t5_translation.py --output_dir outputs/t5-number-words

# Every test: tests/unit (fast, one process), tests/integration (one process, the Trainer and the recipes end to end)
# and tests/distributed (several gloo ranks); the 20 slowest are listed at the end. `make unit`: tests/unit only.
test: setup lint
	$(PYTHON) -m pytest -q tests --durations=20

unit:
	$(PYTHON) -m pytest -q tests/unit

lint:
	$(PYTHON) -m ruff check hf_flexdemo recipes benchmarks tests docs

# Regenerate docs/configuration.md from the knobs' definition (tests/unit/test_docs.py fails while it is stale).
docs:
	$(PYTHON) docs/generate_configuration.py

# The products in their quick modes (benchmarks/README.md; the studies are not rerun): about an hour on 2 cores;
# bandwidth and time_to_target need root (the emulated link).
bench-quick:
	$(PYTHON) benchmarks/optimizer_step.py
	$(PYTHON) benchmarks/replicator_bytes.py
	$(PYTHON) benchmarks/bandwidth.py --quick
	$(PYTHON) benchmarks/convergence.py --quick
	$(PYTHON) benchmarks/time_to_target.py

# The sweeps the package defaults come from (hours on 2 cores; each resumes where it stopped): local steps, then
# the step-wise mode's knobs.
bench-defaults:
	$(PYTHON) benchmarks/sweep.py local
	$(PYTHON) benchmarks/sweep.py local_long
	$(PYTHON) benchmarks/sweep.py density
	$(PYTHON) benchmarks/sweep.py levers
	$(PYTHON) benchmarks/sweep.py overlap

# On a lent GPU machine (torch with CUDA already there; never reinstalled): the optimizer step on CUDA and a short
# bf16 recipe run, JSON into $OUT (default benchmarks/results/gpu/).
gpu-check:
	PYTHON=$(PYTHON) bash benchmarks/gpu_check.sh

clean:
	rm -rf outputs build *.egg-info .pytest_cache .ruff_cache
