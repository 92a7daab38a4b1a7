# Two commands do everything on a fresh machine:
#   make lab    set up .venv if needed, then open the course in JupyterLab (localhost, token on)
#   make test   set up .venv if needed, then run the unit tests and execute every notebook
# Other targets: make setup, make record and make bench (on a GPU), make lint, make clean.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# With an NVIDIA GPU, PyPI's default torch (a CUDA build). Without one, a CPU build is enough:
# TORCH_SPEC names it, and TORCH_INDEX can point pip at PyTorch's CPU wheel index
# (make test TORCH_INDEX=https://download.pytorch.org/whl/cpu).
HAS_GPU    := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
TORCH_SPEC ?= $(if $(HAS_GPU),torch,torch==2.13.0)
TORCH_INDEX ?=
PIP        := $(BIN)/python -m pip
ROOT_FLAG  := $(if $(filter 0,$(shell id -u)),--allow-root)  # Jupyter refuses root (containers) without it
PIP_QUIET  := --quiet --disable-pip-version-check

.PHONY: setup lab test unit notebooks record bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "[setup] installing $(TORCH_SPEC) into $(VENV) (GPU: $(if $(HAS_GPU),yes,no))"
	$(PIP) install $(PIP_QUIET) --upgrade pip
	$(PIP) install $(PIP_QUIET) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(PIP) install $(PIP_QUIET) -e ".[lab,test]"
	@touch $(STAMP)

lab: $(STAMP)
	$(BIN)/python -m ipykernel install --user --name flashattn-course --display-name "Python (flashattn course)" >/dev/null
	$(BIN)/python -c "import flashattn; print(flashattn.describe())"
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --no-browser --ServerApp.root_dir=notebooks $(ROOT_FLAG)

test: $(STAMP)
	$(BIN)/python -c "import flashattn; print(flashattn.describe())"
	$(BIN)/python -m pytest tests notebooks --nbmake --nbmake-timeout=900 -q

unit: $(STAMP)
	$(BIN)/python -m pytest tests -q

notebooks: $(STAMP)
	$(BIN)/python -m pytest notebooks --nbmake --nbmake-timeout=900 -q

record: $(STAMP)
	$(BIN)/python -m flashattn.record

bench: $(STAMP)
	$(BIN)/python -m flashattn.bench

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) *.egg-info
