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
	$(PY) -m pip install -e ".[test,plot,deploy,bench,serve]"
	touch $@

lint: install
	$(VENV)/bin/ruff check .

test: install lint
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=15 tests

demo: install
	PATH="$(abspath $(VENV))/bin:$$PATH" bash examples/multi30k/demo.sh "$(DATA)"

# the benchmark: the prepared data, every model trained by the systems recipe (BENCH_ARGS: its flags, e.g.
# "--jobs 8 --device cuda"; a model that is there is kept), then measured (python -m benchmarks.peers)
BENCH_RUN = PATH="$(abspath $(VENV))/bin:$$PATH" $(PY)
bench: install
	test -f .bench/data/data-bin/dict.src.txt || $(BENCH_RUN) examples/multi30k/prepare.py --out .bench/data $(RAW_DIR_FLAG)
	$(BENCH_RUN) -m examples.multi30k.systems --data .bench/data --out .bench/models $(BENCH_ARGS)
	$(BENCH_RUN) -m benchmarks.peers --models .bench/models --data .bench/data --out .bench/out

# the same pipeline on a tiny model, 2,000 training lines, 48 test lines and 30 updates: proves it, measures nothing
bench-quick: install
	test -f .bench-quick/data/data-bin/dict.src.txt || $(BENCH_RUN) examples/multi30k/prepare.py \
		--out .bench-quick/data $(RAW_DIR_FLAG) --train-lines 2000 --test-lines 48 --bpe-merges 1000
	$(BENCH_RUN) -m examples.multi30k.systems --data .bench-quick/data --out .bench-quick/models --jobs 2 \
		--updates 30 --size 2 64 4 256 --max-tokens 1024
	$(BENCH_RUN) -m benchmarks.peers --models .bench-quick/models --data .bench-quick/data --out .bench-quick/out \
		--betas 0 --batch1-sentences 16 --rounds 1

clean:
	rm -rf $(VENV) .demo .bench .bench-quick
