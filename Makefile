# Two commands on a fresh machine:
#   make serve   set up .venv and run `gputally serve` on the embedded default config
#   make test    set up .venv, install what the tests need, and run the whole suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: serve test venv bench clean

$(BIN)/gputally: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -e '.[test]'
	touch $@

venv: $(BIN)/gputally

serve: venv
	$(BIN)/gputally serve

test: venv
	$(BIN)/python -m pytest

bench: venv
	$(BIN)/python bench/pipeline_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
