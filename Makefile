# Two entry points (see README): `make demo` and `make test`. Both install first.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install dev clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: a CPU build; unpinned it pulls a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# index the bundled sample corpus through Dagster and print the evaluation
demo: $(STAMP)
	$(BIN)/rag-assets index
	$(BIN)/rag-assets ask "How do I roll back to the previous embedding model?"

lint: $(STAMP)
	$(BIN)/ruff check rag_assets rag_assets_tests data/make_sample_pdf.py
	$(BIN)/ruff format --check rag_assets rag_assets_tests data/make_sample_pdf.py
	$(BIN)/mypy rag_assets

test: lint
	$(BIN)/pytest -q

dev: $(STAMP)
	$(BIN)/dagster dev -w workspace.yaml

clean:
	rm -rf data/index data/work .pytest_cache .mypy_cache .ruff_cache
