# Two entry points for a new machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
# Anchors whose declared dependencies (torchvision) do not install beside the pinned
# CPU torch; the tests load only their torch-only modules.
NODEPS_ANCHORS := timm==1.0.31 vit-pytorch==1.26.11

.PHONY: demo test lint types pytest clean

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
	touch $@ $(VENV)/.demo

# the main job: the explainer, written to posenc-report/index.html (its path is printed)
demo: $(VENV)/.demo
	$(BIN)/posenc report --out posenc-report

lint: $(VENV)/.test
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

types: $(VENV)/.test
	$(BIN)/mypy

pytest: $(VENV)/.test
	$(BIN)/python -m pytest -q

test: lint types pytest

clean:
	rm -rf $(VENV) build src/*.egg-info src/posenc/*.so src/posenc/core/*.so .pytest_cache .mypy_cache .ruff_cache
