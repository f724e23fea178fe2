# The two commands a newcomer types: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned to the CPU build that lies on these machines; an unpinned torch pulls a
# multi-GB CUDA build. Override with `make test TORCH=` to test without torch.
TORCH ?= torch==2.13.0
# The trainer callbacks' packages (the integrations extra) need torch: installed only with it.
COMMA := ,
DEMO_OUT ?= demo-out

.PHONY: demo test lint typecheck pytest docs wheel-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[plot]"
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(if $(TORCH),$(BIN)/pip install -q "$(TORCH)")
	$(BIN)/pip install -q -e ".[dev,docs$(if $(TORCH),$(COMMA)integrations)]"
	touch $@ $(VENV)/.installed-run

# The whole pipeline on the simulated Ascend-like NPU: profile GPT-3 at three clocks, fit, plan
# a 2% slowdown budget, execute it, measure; a report with figures lands in $(DEMO_OUT). Then
# import a bundled real A100 profile (Perseus, SOSP'24) to show the importers on real data.
demo: $(VENV)/.installed-run
	$(BIN)/opdvfs demo --workload gpt3 --device ascend-910b-like --target 0.02 --out $(DEMO_OUT)
	$(BIN)/opdvfs import "$$($(BIN)/python -m opdvfs.datasets perseus-gpt3-175b-a100)" --out $(DEMO_OUT)/perseus-a100.parquet
	$(BIN)/opdvfs info $(DEMO_OUT)/perseus-a100.parquet

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks scripts examples
	$(BIN)/ruff format --check src tests benchmarks scripts examples

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

pytest: $(VENV)/.installed-dev
	$(BIN)/pytest -q

# The docs site (mkdocs.yml, docs/): strict, so a broken link, reference or page left out of
# the nav fails. The site lands in build/site.
docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir build/site

# What `pip install opdvfs` gives a user: the wheel, built and installed with no extras into a
# fresh virtualenv outside the source tree, runs `opdvfs demo` and reads a bundled dataset.
WHEEL_DIR := build/wheel-check
wheel-check: | $(BIN)/python
	rm -rf $(WHEEL_DIR)
	$(BIN)/pip wheel -q . --no-deps -w $(WHEEL_DIR)/dist
	$(PYTHON) -m venv $(WHEEL_DIR)/venv
	$(WHEEL_DIR)/venv/bin/pip install -q $(WHEEL_DIR)/dist/opdvfs-*.whl
	cd $(WHEEL_DIR) && venv/bin/python -c "import opdvfs, sys; sys.exit(0 if '/venv/' in opdvfs.__file__ else 'opdvfs not from the wheel: ' + opdvfs.__file__)"
	cd $(WHEEL_DIR) && venv/bin/opdvfs demo --workload resnet50 --device ascend-910b-like --out demo-out
	cd $(WHEEL_DIR) && venv/bin/opdvfs info "$$(venv/bin/python -m opdvfs.datasets perseus-gpt3-175b-a100)" > /dev/null

test: lint typecheck pytest docs wheel-check

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache .mypy_cache .ruff_cache .hypothesis
