# Set-up is part of every target: `make run` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# `make run` installs the service (requirements.lock); `make test` adds the test tools
# (requirements-dev.lock). Both lock files pin every package with its hashes.
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
# The exact BM25 extension (extension/), built with PGXS against the embedded PostgreSQL and
# installed into its folder in the virtual environment.
BM25_STAMP := $(VENV)/.installed-bm25

# torch is installed first, pinned, from TORCH_INDEX; the lock files leave it out. Unset, pip's
# own configuration decides, and on Linux the public index (PyPI) serves the CUDA build (several
# GB with its nvidia-* packages) even for a pinned version. For the CPU build:
#   make run TORCH_INDEX=https://download.pytorch.org/whl/cpu
# and for a given CUDA version, TORCH_INDEX=https://download.pytorch.org/whl/cuXYZ (pytorch.org
# lists the CUDA versions each release is built for).
TORCH_VERSION := 2.13.0
TORCH_INDEX ?=
TORCH_INSTALL := torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

# Offline by default: the default model ships in a Python package, and nothing downloads at run
# time. `make run HF_HUB_OFFLINE=0` lets a model name (RAGSERVICE_EMBEDDING_MODEL,
# RAGSERVICE_RERANKER) download from the Hugging Face hub on first use.
HF_HUB_OFFLINE ?= 1
export HF_HUB_OFFLINE
# Idle torch threads otherwise spin and steal CPU from PostgreSQL on small machines.
export OMP_WAIT_POLICY := PASSIVE

.PHONY: run test test-citus-leaks browser ocr bench-ocr bench-pdf bench-fidelity bench-questions lint typecheck lock bench-ingest bench-ingest-compare bench-write bench-bm25 bench-bm25-memory bench-search bench-query bench-tracing bench-cache bench-replicas bench-feedback bench-reranker bench-rls bench-permissions bench-hostile bench-injection bench-scale bench-soak clean

# The locked packages without their dependencies (the lock holds them all), then the project.
$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(TORCH_INSTALL)
	$(BIN)/pip install --quiet --no-deps -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	$(BIN)/pip check
	touch $(STAMP)

$(DEV_STAMP): $(STAMP) requirements-dev.lock
	$(BIN)/pip install --quiet --no-deps -r requirements-dev.lock
	$(BIN)/pip check
	touch $(DEV_STAMP)

# A C compiler is needed once, for the extension: Debian's gcc is installed when none is found
# (as root, or through sudo), as chromium is for the browser tests.
$(BM25_STAMP): $(STAMP) $(wildcard extension/*.c extension/*.sql extension/*.control extension/Makefile)
	@if ! command -v gcc >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; \
	  else echo "no C compiler found: install Debian's gcc and libc6-dev as root"; exit 1; fi; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends gcc libc6-dev; \
	fi
	$(MAKE) -C extension --no-print-directory PG_CONFIG="$$($(BIN)/python -c 'from ragservice.db.embedded import postgres_bin_dir; print(postgres_bin_dir() / "pg_config")')" install
	touch $(BM25_STAMP)

# Regenerates both lock files from pyproject.toml (needs the package index; a few minutes).
# Pins move only where pyproject.toml asks; `make lock LOCK_ARGS=--upgrade` takes the newest
# releases allowed. torch's own dependencies are resolved against its build from TORCH_INDEX.
LOCK_VENV := .venv-lock
PIP_COMPILE = CUSTOM_COMPILE_COMMAND="make lock" $(LOCK_VENV)/bin/pip-compile --quiet --generate-hashes --strip-extras \
	--no-emit-index-url --no-emit-find-links \
	--unsafe-package torch --unsafe-package ragservice -c $(LOCK_VENV)/torch.txt $(LOCK_ARGS) \
	$(if $(TORCH_INDEX),--pip-args "--extra-index-url $(TORCH_INDEX)")
lock:
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet pip-tools==7.7.0
	echo "torch==$(TORCH_VERSION)" > $(LOCK_VENV)/torch.txt
	$(PIP_COMPILE) --all-extras -o requirements-dev.lock pyproject.toml
	# The service's lock starts from the dev lock's pins, so both agree on every version.
	cp requirements-dev.lock requirements.lock
	$(PIP_COMPILE) --extra onnx --extra parquet --extra otel --extra mcp --extra ocr --extra s3 -o requirements.lock pyproject.toml

# Local use: loopback only, and without API keys unless RAGSERVICE_AUTH_DISABLED=0 is given.
run: $(STAMP) $(BM25_STAMP)
	@$(MAKE) --no-print-directory ocr || echo "OCR is unavailable (tesseract could not be installed): scanned PDF pages and images will fail; see 'make ocr'"
	RAGSERVICE_AUTH_DISABLED=$${RAGSERVICE_AUTH_DISABLED:-1} $(BIN)/ragservice serve --host 127.0.0.1

# The console's browser tests drive the system's Chromium (Playwright's own browser download is
# not used). Debian's package is installed when no browser is found: as root, or through sudo.
BROWSER ?= $(firstword $(wildcard $(RAGSERVICE_BROWSER) /usr/bin/chromium /usr/bin/chromium-browser))
browser:
	@if [ -n "$(BROWSER)" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; \
	else echo "no chromium found: install Debian's chromium package as root (or set RAGSERVICE_BROWSER)"; exit 1; fi; \
	$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends chromium

# OCR of scanned PDF pages and images runs Debian's tesseract (the `ocr` extra is its Python
# side). Installed when no tesseract is found: as root, or through sudo. `run` goes on without.
ocr:
	@if command -v tesseract >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; \
	else echo "no tesseract found: install Debian's tesseract-ocr and tesseract-ocr-eng as root (or set RAGSERVICE_OCR=off)"; exit 1; fi; \
	$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends tesseract-ocr tesseract-ocr-eng

# pytest exits 5 when it collected no test at all; say so instead of failing obscurely.
# RAGSERVICE_REQUIRE_BROWSER: the browser tests fail instead of skipping without a browser.
# The suite runs on TEST_WORKERS pytest-xdist workers (one per core, at most 4: each has its own
# embedded PostgreSQL and model), a test file's tests all on one (`--dist loadfile`: a module's
# fixtures are built once, and its tests run in order). `make test TEST_WORKERS=0` runs it in
# one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
test: $(DEV_STAMP) $(BM25_STAMP) browser ocr
	RAGSERVICE_REQUIRE_BROWSER=1 $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests were collected"; fi; exit $$rc

# The leak suites of one server run on a Citus cluster: each test's database is a clone of a
# distributed store on every node (tests/citus_template.py; Citus installed by CITUS_INSTALLER).
CITUS_LEAK_SUITES := tests/api/test_tenant_isolation.py tests/integration/test_tenant_isolation.py \
	tests/api/test_permissions.py tests/api/test_permission_attacks.py \
	tests/api/test_bm25_side_channel.py tests/api/test_mcp_permissions.py \
	tests/integration/test_permissions_cli.py tests/api/test_feedback.py tests/api/test_cache.py \
	tests/api/test_auth.py tests/api/test_search_api.py tests/api/test_sources_api.py \
	tests/api/test_openai_embeddings.py tests/api/test_bulk_import.py tests/api/test_cli_tenant.py \
	tests/api/test_console_api.py tests/api/test_fair_share.py tests/api/test_model_switch.py
test-citus-leaks: $(DEV_STAMP) $(BM25_STAMP)
	CITUS_TEST_CLUSTER=1 $(BIN)/pytest -q $(CITUS_LEAK_SUITES)

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

bench-ocr: $(DEV_STAMP) ocr
	$(BIN)/python benchmarks/ocr.py

bench-pdf: $(DEV_STAMP)
	$(BIN)/python benchmarks/pdf_compare.py

# Other readers of the real-document corpus, beside the loader (benchmarks/fidelity.py), in
# their own virtual environment: the project's never imports them (PyMuPDF and pymupdf4llm are
# AGPL). unstructured's PDF partitioner imports its layout models' packages (torch) even for the
# `fast` strategy, so torch is installed first as for the service (TORCH_INDEX) and held at
# its version (torchvision would otherwise pull a newer CUDA build). Nothing downloads at run
# time: unstructured is reported absent until spaCy's en_core_web_sm (not on PyPI; unstructured
# would fetch it on first use) is installed into .venv-peers by hand. New pins take effect after
# `rm -rf .venv-peers`. poppler-utils (pdftotext) is installed when missing: as root, or sudo.
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed
PEERS := pymupdf==2.0 pymupdf4llm==2.0 'markitdown[pdf,docx,pptx,xlsx,xls,outlook]==0.1.9' \
	'unstructured[pdf,docx,pptx,xlsx,epub,odt,rtf,md,csv]==0.27.35' pdfplumber==0.11.11 pypdfium2==5.15.2
$(PEERS_STAMP):
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet $(TORCH_INSTALL)
	$(PEERS_VENV)/bin/pip install --quiet torch==$(TORCH_VERSION) $(PEERS)
	$(PEERS_VENV)/bin/pip check
	touch $(PEERS_STAMP)

bench-fidelity: $(DEV_STAMP) $(PEERS_STAMP)
	@if command -v pdftotext >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; \
	else echo "no pdftotext found: install Debian's poppler-utils as root"; exit 1; fi; \
	$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends poppler-utils
	$(BIN)/python benchmarks/fidelity.py --peers $(PEERS_VENV)/bin/python

# The real-document corpus ingested (its own data directory) and every question of
# tests/realdocs/*/questions.jsonl asked: is the first citation the right file and place?
bench-questions: $(DEV_STAMP) $(BM25_STAMP)
	$(BIN)/python benchmarks/realdocs_questions.py

bench-scale: $(DEV_STAMP)
	$(BIN)/python benchmarks/scale.py --chunks 1000000 --data ../shared/data/scifact

bench-ingest: $(DEV_STAMP)
	$(BIN)/python benchmarks/ingest.py --corpus ../shared/data/scifact

bench-ingest-compare: $(DEV_STAMP)
	$(BIN)/python benchmarks/ingest.py --corpus ../shared/data/scifact --compare

bench-write: $(DEV_STAMP)
	$(BIN)/python benchmarks/write_path.py --corpus ../shared/data/scifact --repeat 10

# Exact BM25 (the extension) against the SQL statement, on SciFact x 10 (kept in .ragservice-bm25).
bench-bm25: $(DEV_STAMP) $(BM25_STAMP)
	$(BIN)/python benchmarks/exact_bm25.py --corpus ../shared/data/scifact --repeat 10 --data-dir .ragservice-bm25

bench-bm25-memory: $(DEV_STAMP) $(BM25_STAMP)
	$(BIN)/python benchmarks/bm25_memory.py --chunks 1000000

bench-search: $(DEV_STAMP)
	$(BIN)/python benchmarks/eval_beir.py --data ../shared/data/scifact

bench-query: $(DEV_STAMP)
	$(BIN)/python benchmarks/query.py --data ../shared/data/scifact

# Request latency with OpenTelemetry tracing off and on (spans made, none exported).
bench-tracing: $(DEV_STAMP)
	$(BIN)/python benchmarks/tracing.py --data ../shared/data/scifact

bench-cache: $(DEV_STAMP)
	$(BIN)/python benchmarks/cache.py --data ../shared/data/scifact

bench-replicas: $(DEV_STAMP)
	$(BIN)/python benchmarks/replicas.py --data ../shared/data/scifact

bench-feedback: $(DEV_STAMP)
	$(BIN)/python benchmarks/feedback_loop.py --data ../shared/data/scifact

bench-reranker: $(DEV_STAMP)
	$(BIN)/python benchmarks/reranker.py --data ../shared/data/scifact

# Ingests SciFact into its own data directory first (a no-op once done).
bench-rls: $(DEV_STAMP)
	RAGSERVICE_DATA_DIR=.ragservice-rls $(BIN)/ragservice ingest ../shared/data/scifact/corpus.jsonl -c scifact
	$(BIN)/python benchmarks/rls.py --data ../shared/data/scifact --data-dir .ragservice-rls

# Search as a user who may read a tenth of 100k chunks, beside an admin (its own data directory).
bench-permissions: $(DEV_STAMP) $(BM25_STAMP)
	$(BIN)/python benchmarks/permissions.py --chunks 100000 --groups 1000 --data ../shared/data/scifact

# Search latency while an ingest worker parses a hostile file (its own data directory).
bench-hostile: $(DEV_STAMP)
	$(BIN)/python benchmarks/hostile.py --data ../shared/data/scifact

# Injection patterns planted in SciFact passages: detection, false flags, escaped delimiters.
bench-injection: $(DEV_STAMP)
	$(BIN)/python benchmarks/injection.py --data ../shared/data/scifact

# Mixed traffic for 30 minutes against a server already running (`make run`; `--url` for another)
# that holds the collection SOAK_COLLECTION; e.g. SOAK_ARGS='--minutes 2 --api-key KEY'.
SOAK_COLLECTION ?= scifact
bench-soak: $(DEV_STAMP)
	$(BIN)/python benchmarks/soak.py --collection $(SOAK_COLLECTION) $(SOAK_ARGS)

clean:
	rm -rf $(VENV) $(LOCK_VENV) $(PEERS_VENV) .ragservice .ragservice-injection .ragservice-realdocs .pytest_cache .mypy_cache .ruff_cache
