# make test: install everything into .venv and run the test suite
# make demo: install, train a small model on Multi30k en->de, translate test_2016_flickr
#   raw Multi30k: DATA=/path, else ../shared/data/multi30k when that directory exists, else downloaded
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SHARED_DATA := ../shared/data/multi30k
# empty when SHARED_DATA is not a directory: prepare.py then downloads the raw files
DATA ?= $(if $(wildcard $(SHARED_DATA)/.),$(SHARED_DATA))
RAW_DIR_FLAG = $(if $(DATA),--raw-dir "$(DATA)")
# the CPU wheel; GPU users: make install TORCH="torch==<version matching your CUDA>"
TORCH ?= torch==2.13.0

.PHONY: install test lint demo bench bench-quick clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# CPU torch wheel first: an unpinned torch would pull a multi-GB CUDA build
	$(PY) -m pip install "$(TORCH)"
	$(PY) -m pip install -e ".[test,plot,deploy,bench]"
	touch $@

lint: install
	$(VENV)/bin/ruff check .

test: install lint
	$(PY) -m pytest -q --durations=10 tests

demo: install
	PATH="$(abspath $(VENV))/bin:$$PATH" bash examples/multi30k/demo.sh "$(DATA)"

# side-by-side benchmark (python -m benchmarks.run); BENCH_ARGS="--device cuda --jobs 8 --extras" on a GPU
bench: install
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m benchmarks.run --out .bench $(RAW_DIR_FLAG) $(BENCH_ARGS)

bench-quick: install
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m benchmarks.run --out .bench-quick $(RAW_DIR_FLAG) --quick --jobs 2

clean:
	rm -rf $(VENV) .demo .bench .bench-quick
