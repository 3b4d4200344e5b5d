# make test: install everything into .venv and run the test suite
# make demo: install, train a small model on Multi30k en->de, translate test_2016_flickr
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DATA ?= ../shared/data/multi30k

.PHONY: install test lint demo clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# CPU torch wheel first: an unpinned torch would pull a multi-GB CUDA build
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[test,plot]"
	touch $@

lint: install
	$(VENV)/bin/ruff check .

test: install lint
	$(PY) -m pytest -q tests

demo: install
	PATH="$(abspath $(VENV))/bin:$$PATH" bash examples/multi30k/demo.sh "$(DATA)"

clean:
	rm -rf $(VENV) .demo
