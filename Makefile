# Set-up is part of every target: `make run` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Nothing downloads models at run time: the default model ships in a Python package.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# Idle torch threads otherwise spin and steal CPU from PostgreSQL on small machines.
export OMP_WAIT_POLICY := PASSIVE

.PHONY: run test lint typecheck bench-ingest bench-ingest-compare bench-search bench-query bench-cache bench-replicas bench-feedback bench-rls bench-hostile bench-injection bench-scale bench-soak clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Local use: loopback only, and without API keys unless RAGSERVICE_AUTH_DISABLED=0 is given.
run: $(STAMP)
	RAGSERVICE_AUTH_DISABLED=$${RAGSERVICE_AUTH_DISABLED:-1} $(BIN)/ragservice serve --host 127.0.0.1

# pytest exits 5 when it collected no test at all; say so instead of failing obscurely.
test: $(STAMP)
	$(BIN)/pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests were collected"; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

bench-scale: $(STAMP)
	$(BIN)/python benchmarks/scale.py --chunks 1000000 --data ../shared/data/scifact

bench-ingest: $(STAMP)
	$(BIN)/python benchmarks/ingest.py --corpus ../shared/data/scifact

bench-ingest-compare: $(STAMP)
	$(BIN)/python benchmarks/ingest.py --corpus ../shared/data/scifact --compare

bench-search: $(STAMP)
	$(BIN)/python benchmarks/eval_beir.py --data ../shared/data/scifact

bench-query: $(STAMP)
	$(BIN)/python benchmarks/query.py --data ../shared/data/scifact

bench-cache: $(STAMP)
	$(BIN)/python benchmarks/cache.py --data ../shared/data/scifact

bench-replicas: $(STAMP)
	$(BIN)/python benchmarks/replicas.py --data ../shared/data/scifact

bench-feedback: $(STAMP)
	$(BIN)/python benchmarks/feedback_loop.py --data ../shared/data/scifact

# Ingests SciFact into its own data directory first (a no-op once done).
bench-rls: $(STAMP)
	RAGSERVICE_DATA_DIR=.ragservice-rls $(BIN)/ragservice ingest ../shared/data/scifact/corpus.jsonl -c scifact
	$(BIN)/python benchmarks/rls.py --data ../shared/data/scifact --data-dir .ragservice-rls

# Search latency while an ingest worker parses a hostile file (its own data directory).
bench-hostile: $(STAMP)
	$(BIN)/python benchmarks/hostile.py --data ../shared/data/scifact

# Injection patterns planted in SciFact passages: detection, false flags, escaped delimiters.
bench-injection: $(STAMP)
	$(BIN)/python benchmarks/injection.py --data ../shared/data/scifact

# Mixed traffic for 30 minutes against a server already running (`make run`; `--url` for another)
# that holds the collection SOAK_COLLECTION; e.g. SOAK_ARGS='--minutes 2 --api-key KEY'.
SOAK_COLLECTION ?= scifact
bench-soak: $(STAMP)
	$(BIN)/python benchmarks/soak.py --collection $(SOAK_COLLECTION) $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .ragservice .ragservice-injection .pytest_cache .mypy_cache .ruff_cache
