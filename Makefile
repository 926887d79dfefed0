# Two entry points (see README): `make demo` and `make test`; `make test-fast` is the quick
# tier for contributors. All install first.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint install dev clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: a CPU build; unpinned it pulls a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	# the rest through uv: the same PyPI releases, fetched and unpacked in parallel (58 s for the
	# whole install against pip's 112 s on 2 cores, 2026-12-05); torch stays pinned to the above;
	# compiled to bytecode as pip does (without it every test process compiles torch and Dagster)
	$(BIN)/pip install -q uv
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -e ".[dev]" torch==2.13.0
	touch $(STAMP)

install: $(STAMP)

# index the bundled sample corpus through Dagster and print the evaluation
demo: $(STAMP)
	$(BIN)/rag-assets index
	@echo "note: broken-scan.pdf FAILED on purpose: the sample folder ships a damaged PDF to show that a file that cannot be read fails alone, with its reason, while the rest is indexed"
	$(BIN)/rag-assets ask "How do I roll back to the previous embedding model?"
	@echo
	@echo "rag-assets is $(abspath $(BIN))/rag-assets. To run the README's commands as written:"
	@echo "    . $(BIN)/activate"

lint: $(STAMP)
	$(BIN)/ruff check rag_assets rag_assets_tests data/make_sample_pdf.py
	$(BIN)/ruff format --check rag_assets rag_assets_tests data/make_sample_pdf.py
	$(BIN)/mypy rag_assets

# test processes (pytest-xdist): three on the 2-core CI machine, as the tests wait on servers,
# subprocesses and Dagster's daemons much of the time (two processes kept the two cores 70 %
# busy, three 90 %: 21.1 min of tests instead of about 27, docs/measurements.md#test-tiers,
# 2026-12-05); whole files go to one process (--dist loadfile), so a file's module fixtures are built once, in collection order
# (--no-loadscope-reorder: the longest files first, see LONGEST_FILES in conftest.py; xdist's
# default order, most tests first, left files of one long test for the end). TEST_WORKERS=0: one
TEST_WORKERS ?= 3
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# the full tier, what CI runs (.ci/run): every test, incl. real models on ../shared, kill -9, BEIR;
# it ends with its 25 slowest tests, so a test that breaks a budget (docs/development.md) shows
test: lint
	$(BIN)/pytest -q $(XDIST) --durations=25

# the default tier for contributors (<= 5 min on two cores): unit, property and small tests
test-fast: lint
	$(BIN)/pytest -q $(XDIST) -m "not slow"

# the Dagster UI on http://127.0.0.1:3000 (`rag-assets ui`: dagster dev on the project's code
# location) with the runs `rag-assets index` recorded in the index's own instance: the demo's
# (data/index/.rag-work/dagster), or RAG_INDEX_URI's; DEV_ARGS="--port 3001" to change the port.
# exec: make's child is rag-assets itself, so the SIGTERM make forwards reaches it; it stops
# dagster dev with its webserver, daemon and code servers (Ctrl-C too)
dev: $(STAMP)
	exec $(BIN)/rag-assets ui $(DEV_ARGS)

clean:
	rm -rf data/index data/work .pytest_cache .mypy_cache .ruff_cache
