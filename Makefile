# Two commands do all the set-up on a fresh machine (Python 3.11 and pip):
#   make demo   builds a tiny model and toy data, trains RRHF with `axolotl train` on the CPU,
#               and prints the reward before and after
#   make test   runs the test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
# axolotl runs offline here: every model and dataset is built locally
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export AXOLOTL_DO_NOT_TRACK := 1
export WANDB_MODE := disabled
# `axolotl train` runs `accelerate` by name
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo test install benchmark

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

demo: install
	$(PY) -m pofe.demo

test: install
	$(PY) -m pytest -q -p no:cacheprovider

benchmark: install
	$(PY) -m benchmarks.run
