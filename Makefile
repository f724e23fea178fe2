# The two commands a newcomer types: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned to the CPU build that lies on these machines; an unpinned torch pulls a
# multi-GB CUDA build. Override with `make test TORCH=` to test without torch.
TORCH ?= torch==2.13.0
DEMO_OUT ?= demo-out

.PHONY: demo test lint typecheck pytest clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(if $(TORCH),$(BIN)/pip install -q "$(TORCH)")
	$(BIN)/pip install -q -e ".[dev]"
	touch $@ $(VENV)/.installed-run

# Until `opdvfs demo` lands (issue #7) the demo runs the pipeline step by step on the simulated
# Ascend-like NPU: profile GPT-3 at three clocks, summarise, fit, plan a 2% slowdown budget,
# run the plan and the top clock and a static low clock for comparison; then import a bundled
# real A100 profile.
demo: $(VENV)/.installed-run
	@mkdir -p $(DEMO_OUT)
	$(BIN)/opdvfs profile --device ascend-910b-like --workload gpt3 --freqs 1000,1400,1800 --out $(DEMO_OUT)/gpt3.parquet
	$(BIN)/opdvfs info $(DEMO_OUT)/gpt3.parquet
	$(BIN)/opdvfs fit $(DEMO_OUT)/gpt3.parquet --out $(DEMO_OUT)/models.json
	$(BIN)/opdvfs plan $(DEMO_OUT)/gpt3.parquet --target 0.02 --objective core-energy --out $(DEMO_OUT)/schedule.json
	$(BIN)/opdvfs simulate $(DEMO_OUT)/schedule.json --device ascend-910b-like --workload gpt3
	$(BIN)/opdvfs simulate --device ascend-910b-like --workload gpt3 --freq-mhz 1800
	$(BIN)/opdvfs simulate --device ascend-910b-like --workload gpt3 --freq-mhz 1300
	$(BIN)/opdvfs import "$$($(BIN)/python -m opdvfs.datasets perseus-gpt3-175b-a100)" --out $(DEMO_OUT)/perseus-a100.parquet
	$(BIN)/opdvfs info $(DEMO_OUT)/perseus-a100.parquet

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

pytest: $(VENV)/.installed-dev
	$(BIN)/pytest -q

test: lint typecheck pytest

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache .mypy_cache .ruff_cache .hypothesis
