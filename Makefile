# Two entry points for a new machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
# Anchors whose declared dependencies (torchvision) do not install beside the pinned
# CPU torch; the tests load only their torch-only modules.
NODEPS_ANCHORS := timm==1.0.31 vit-pytorch==1.26.11
# fla-core (pinned in constraints-dev.txt): tests/test_fla.py loads its two dense references
# by path from here. Not in site-packages: with `fla` importable, transformers sends some
# families' linear attention to fla's Triton kernels, which the family test cannot run.
FLA_CORE := $(VENV)/fla-core

.PHONY: demo test docs lint types pytest clean gpu-wheels gpu-check engines engine-table arithmetic-table learned-table extend-table grid-table

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# setup.py builds the optional compiled kernels (src/posenc/core/csrc/) in place
KERNEL_SOURCES := $(wildcard src/posenc/core/csrc/*.c src/posenc/core/csrc/*.h)
$(VENV)/.demo: pyproject.toml setup.py $(KERNEL_SOURCES) constraints-dev.txt | $(BIN)/python
	$(PIP) install -q -c constraints-dev.txt -e ".[torch,plot]"
	touch $@

$(VENV)/.test: pyproject.toml setup.py $(KERNEL_SOURCES) constraints-dev.txt | $(BIN)/python
	$(PIP) install -q -c constraints-dev.txt -e ".[torch,plot,test]"
	$(PIP) install -q --no-deps $(NODEPS_ANCHORS)
	$(PIP) install -q --no-deps --upgrade --target $(FLA_CORE) -c constraints-dev.txt fla-core
	touch $@ $(VENV)/.demo

# the main job: the explainer, written to posenc-report/index.html (its path is printed)
demo: $(VENV)/.demo
	$(BIN)/posenc report --out posenc-report

# the documentation site, strictly (a warning fails it), into docs/_build/html; it works
# offline. The explainer (posenc report) is built into it; tests/test_docs.py runs the
# same command and reads the result in chromium.
DOCS_OUT ?= docs/_build/html
docs: $(VENV)/.test
	rm -rf $(DOCS_OUT) docs/_build/doctrees  # a fresh build: -W sees every page's warnings
	$(BIN)/python -m sphinx -b html -n -W --keep-going -j 2 -d docs/_build/doctrees docs $(DOCS_OUT)
	@echo "docs: $(DOCS_OUT)/index.html"

lint: $(VENV)/.test
	$(BIN)/ruff check src tests docs
	$(BIN)/ruff format --check src tests docs

types: $(VENV)/.test
	$(BIN)/mypy

pytest: $(VENV)/.test
	$(BIN)/python -m pytest -q

# lint, then the type check beside the suite: mypy takes one core for about 45 s (from
# cold), which the suite mostly leaves idle. pytest's summary stays the last line but
# where mypy fails.
test: lint
	@$(BIN)/mypy & types=$$!; \
	$(BIN)/python -m pytest -q; tests=$$?; \
	wait $$types; typed=$$?; \
	if [ $$typed -ne 0 ]; then echo "make test: mypy failed (its report is above)"; fi; \
	[ $$tests -eq 0 ] && [ $$typed -eq 0 ]

# On a GPU machine with no network: the GPU tests and the CUDA benchmarks, with the
# machine's own python3 (its torch, triton, transformers and numpy are kept), into
# $(OUT) (default gpu-check-out/). See tools/gpu_check.py.
gpu-check:
	$(PYTHON) tools/gpu_check.py $(OUT)

# The pure-Python wheels gpu-check installs where the GPU machine lacks them (no
# network there): pytest and hypothesis with their dependencies, mpmath, the peers the
# benchmarks time (Liger-Kernel, x-transformers, rotary-embedding-torch,
# positional-encodings) and theirs, and setuptools and wheel for the editable build.
# Only py3-none-any wheels, whatever this machine is; git-ignored, a few MiB. (hypothesis
# 6.155.7: the last release with a pure-Python wheel.)
GPU_WHEELS := \
	pytest==9.2.0 iniconfig==2.3.1 pluggy==1.7.0 packaging==26.4 pygments==2.21.0 \
	exceptiongroup==1.3.2 tomli==2.5.0 \
	hypothesis==6.155.7 sortedcontainers==2.4.0 mpmath==1.3.0 \
	liger-kernel==0.8.5 \
	x-transformers==2.31.10 einops==0.8.2 einx==0.4.3 frozendict==2.5.1 loguru==0.7.3 \
	torch-einops-utils==0.2.0 \
	rotary-embedding-torch==0.9.1 positional-encodings==6.0.3 \
	setuptools==84.2.1 wheel==0.48.0

gpu-wheels: | $(BIN)/python
	rm -rf gpu-wheels.tmp
	$(PIP) download -q --no-deps --only-binary=:all: --platform any --implementation py \
		--abi none --python-version 3.11 -d gpu-wheels.tmp $(GPU_WHEELS)
	@bad=$$(ls gpu-wheels.tmp | grep -v -e '-none-any\.whl$$'); \
		if [ -n "$$bad" ]; then echo "not pure Python: $$bad"; exit 1; fi
	rm -rf gpu-wheels && mv gpu-wheels.tmp gpu-wheels
	@echo "gpu-wheels: $$(ls gpu-wheels | wc -l) wheels, $$(du -sh gpu-wheels | cut -f1)"

# The engines `posenc rope CONFIG --engines NAME` runs, each in its own environment in the
# user cache ($POSENC_ENGINES, else $XDG_CACHE_HOME/posenc/engines), one directory per
# engine and pins: `posenc engines build` builds those not built yet (from the recipes in
# src/posenc/integration/analysis/engine_recipes/; PyPI and the CPU torch on this
# machine's disk only; offline once built). Always run: the command itself knows what is
# built.
engines: $(VENV)/.demo
	$(BIN)/posenc engines build all

# Every engine on every config of the cross-engine table (the README's and the report's),
# written to the bundled src/posenc/faces/data/rope-engines.json
engine-table: $(VENV)/.demo engines
	$(BIN)/python -m posenc.faces.engine_table

# posenc lab extend at its defaults (3 seeds; 31 minutes on 2 CPU
# cores; --quick: 11), bundled: src/posenc/faces/data/lab-extend.json, the tables of
# docs/howto/choose-schedule.md, docs/lab-extend.png
extend-table: $(VENV)/.demo
	$(BIN)/posenc lab extend --out posenc-extend
	$(BIN)/python -m posenc.faces.lab.extend posenc-extend

# posenc lab arithmetic at its defaults (3 seeds; about an hour on 2 CPU cores), bundled:
# src/posenc/faces/data/lab-arithmetic.json, the README's table, docs/lab-arithmetic.png
arithmetic-table: $(VENV)/.demo
	$(BIN)/posenc lab arithmetic --out posenc-arithmetic
	$(BIN)/python -m posenc.faces.lab.arithmetic posenc-arithmetic

# posenc lab grid at its defaults (7 lines x 3 seeds; see docs/guides/lab.md for the
# time it took on 2 CPU cores), bundled: src/posenc/faces/data/lab-grid.json, the table of
# docs/guides/lab.md, docs/lab-grid.png
grid-table: $(VENV)/.demo
	$(BIN)/posenc lab grid --out posenc-grid
	$(BIN)/python -m posenc.faces.lab.grid posenc-grid

# the explainer's learned table (posenc.analysis.train_learned at its defaults: 32 positions
# x 32 channels, 300 steps, seed 0; a few seconds), trained again and bundled: posenc
# report reads src/posenc/faces/data/learned-table.json instead of training at every build
learned-table: $(VENV)/.demo
	$(BIN)/python -m posenc.faces.learned_table

clean:
	rm -rf $(VENV) build src/*.egg-info src/posenc/*.so src/posenc/core/*.so .pytest_cache .mypy_cache .ruff_cache
