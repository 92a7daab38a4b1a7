# Two commands do everything on a fresh machine:
#   make lab    set up .venv if needed, then open the course in JupyterLab (localhost, token on)
#   make test   set up .venv if needed, then run the unit tests and execute every notebook
# Other targets: make setup, make record and make bench (on a GPU), make figures, make gpu-test (on a GPU),
# make lint, make clean.

# Triton publishes no wheels for macOS or Windows: there the course runs in a Linux container (README, "On a Mac or
# Windows"). Stop at once with that route rather than a pip error halfway through the set-up.
ifeq ($(OS),Windows_NT)
PLATFORM ?= Windows
else
PLATFORM ?= $(shell uname -s)
endif
ifneq ($(filter Darwin Windows% MINGW% MSYS% CYGWIN%,$(PLATFORM)),)
$(error This course needs Linux: Triton has no wheels for $(PLATFORM). Open it in the container instead: \
  open this folder in VS Code and choose "Reopen in Container" (.devcontainer/), or run \
  `docker build -t flashattn-course . && docker run --rm -it -p 127.0.0.1:8888:8888 flashattn-course` \
  and open the URL it prints. README.md, "On a Mac or Windows", says more)
endif

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# With an NVIDIA GPU, torch 2.11.0 (PyPI's CUDA 13 build, with Triton 3.6.0): the pair every kernel was run,
# checked and timed with on the H200 (README, "Versions"). Without one, torch 2.13.0 (a CPU build is enough;
# pip then takes the newest Triton the course allows, 3.9, which CI compiles every kernel with for sm_75 to
# sm_90). TORCH_SPEC chooses another version; TORCH_INDEX points pip at another wheel index
# (make test TORCH_INDEX=https://download.pytorch.org/whl/cpu for PyTorch's small CPU-only build).
HAS_GPU    := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
TORCH_SPEC ?= $(if $(HAS_GPU),torch==2.11.0,torch==2.13.0)
TORCH_INDEX ?=
PIP        := $(BIN)/python -m pip
ROOT_FLAG  := $(if $(filter 0,$(shell id -u)),--allow-root)  # Jupyter refuses root (containers) without it
LAB_IP     ?= 127.0.0.1  # the container listens on 0.0.0.0 (its port is published to the host's localhost only)
PIP_QUIET  := --quiet --disable-pip-version-check

.PHONY: setup lab test unit notebooks record bench lint clean figures gpu-test

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
	$(BIN)/jupyter lab --ServerApp.ip=$(LAB_IP) --no-browser --ServerApp.root_dir=notebooks $(ROOT_FLAG)

# Every test and every notebook. The notebooks run twice: under nbmake here, and in a fresh clone by the book
# test (tests/test_book.py), which also checks that running them left that clone clean. The clean-clone test of
# tests/test_notebooks_clean.py (a third run) is left to make gpu-test, where notebooks take their live paths.
# Then the tests that reach into Triton's interpreter and the names that moved between its releases run again with
# the oldest Triton the course allows (torch 2.11's pin), installed beside the venv's own and put first on PYTHONPATH:
# a release whose interpreter takes other arguments fails here, not on a learner's machine.
OLDEST_TRITON := 3.6.0
OLDEST_DIR    := $(VENV)/triton-$(OLDEST_TRITON)
OLDEST_TESTS  := tests/test_triton_compat.py tests/test_runtime.py tests/test_traffic.py \
                 tests/test_exercise_evidence.py tests/test_exercise_mistake_classes.py $(wildcard tests/test_exercises_*.py)
test: $(STAMP) $(OLDEST_DIR)
	$(BIN)/python -c "import flashattn; print(flashattn.describe())"
	$(BIN)/python -m pytest tests notebooks --nbmake --nbmake-timeout=900 -q -m "not clean_clone" --durations=25
	PYTHONPATH=$(OLDEST_DIR) $(BIN)/python -c "import flashattn; print(flashattn.describe())"
	PYTHONPATH=$(OLDEST_DIR) $(BIN)/python -m pytest $(OLDEST_TESTS) -q

$(OLDEST_DIR): $(STAMP)
	$(PIP) install $(PIP_QUIET) --no-deps --target $@ "triton==$(OLDEST_TRITON)"

unit: $(STAMP)
	$(BIN)/python -m pytest tests -q -m "not clean_clone"

notebooks: $(STAMP)
	$(BIN)/python -m pytest notebooks --nbmake --nbmake-timeout=900 -q

record: $(STAMP)
	$(BIN)/python -m flashattn.record

bench: $(STAMP)
	$(BIN)/python -m flashattn.bench

# The committed PNGs in figures/, rebuilt on purpose from the package and figures/data/ (notebooks write nothing).
figures: $(STAMP)
	$(BIN)/python -m flashattn.teaching.figures

# The test suite on a GPU machine: every test file in one run.
# Most of its time is compiling kernels on the CPU, so with pytest-xdist it runs WORKERS processes (default:
# three quarters of the cores, at most 12) sharing the GPUs, each pinned to one GPU in turn.
#   make gpu-test              every test file
#   make gpu-test PART=1       half of the test files (then PART=2), balanced by tests/gpu_durations.json
#   make gpu-test WORKERS=1    one process (without pytest-xdist this is what runs: then use PART=1 and PART=2)
# Each run writes the seconds its test files took into $(DURATIONS) as it goes (commit them to
# tests/gpu_durations.json to balance the parts). It uses .venv when there is one, else $(PYTHON)
# (a GPU machine's own torch: make gpu-test PYTHON=python).
DURATIONS ?= tests/gpu_durations.json
GPUS     = $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
TEST_PY  = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
XDIST    = $(shell $(TEST_PY) -c "import xdist" 2>/dev/null && echo yes)
WORKERS ?= $(shell n=$$(( $$(nproc) * 3 / 4 )); [ $$n -gt 12 ] && n=12; echo $$n)
gpu-test:
	@test "$(GPUS)" -gt 0 2>/dev/null || { echo "gpu-test needs an NVIDIA GPU (nvidia-smi -L lists none)"; exit 2; }
	$(TEST_PY) -m pytest tests -q -p no:cacheprovider --durations=15 --record-durations $(DURATIONS) \
		$(if $(and $(XDIST),$(filter-out 0 1,$(WORKERS))),-n $(WORKERS)) $(if $(PART),--gpu-part $(PART)/2)

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) *.egg-info

# The course as a static HTML book in build/book/ (open build/book/index.html): every notebook executed
# in interpreter mode with the recorded GPU results, nothing loaded from the internet. See tools/book.py.
.PHONY: book
book: $(STAMP)
	$(BIN)/python tools/book.py --out build/book
