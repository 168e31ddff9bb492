# The ragservice API server (and CLI). See docker-compose.yml and docs/production.md.
#
# CPU by default. TORCH_INDEX picks torch's build: the public index (PyPI) serves the CUDA one
#   docker build --build-arg TORCH_INDEX=https://pypi.org/simple -t ragservice:gpu .
# (the compose file's `gpu` profile does that).
ARG PYTHON_IMAGE=python:3.11.14-slim

# -- build: a virtual environment in /opt/venv ----------------------------------------------
FROM ${PYTHON_IMAGE} AS build

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

RUN python -m venv /opt/venv

# torch first, pinned, from TORCH_INDEX (the lock file leaves it out).
RUN pip install torch==${TORCH_VERSION} --index-url ${TORCH_INDEX}

# The locked dependencies (every version and hash pinned) before any code, so that a code
# change rebuilds only the layers below.
WORKDIR /src
COPY requirements.lock ./
RUN pip install --no-deps --require-hashes -r requirements.lock

COPY pyproject.toml README.md LICENSE ./
COPY ragservice ./ragservice
COPY ingest ./ingest
COPY migrations ./migrations
RUN pip install --no-deps . && pip check

# The exact BM25 extension, built with PGXS against the embedded PostgreSQL and installed into
# its folder in the environment (migration 0023 creates it in the database).
COPY extension ./extension
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev make \
    && make -C extension install \
       PG_CONFIG="$(python -c 'from ragservice.db.embedded import postgres_bin_dir; print(postgres_bin_dir() / "pg_config")')" \
    && rm -rf /var/lib/apt/lists/*

# -- runtime: the environment and an unprivileged user, no build files ----------------------
FROM ${PYTHON_IMAGE}

# Offline by default: the default model ships in a Python package. HF_HUB_OFFLINE=0 (docker
# run -e, or the compose file's environment) lets a model name download from the Hugging Face
# hub into HF_HOME, on the data volume. Idle torch threads must not spin and steal CPU.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    HF_HUB_OFFLINE=1 \
    HF_HOME=/data/huggingface \
    OMP_WAIT_POLICY=PASSIVE \
    RAGSERVICE_DATA_DIR=/data

COPY --from=build /opt/venv /opt/venv

# OCR of scans and images (RAGSERVICE_OCR): Debian's tesseract with its English model.
RUN apt-get update && apt-get install -y --no-install-recommends tesseract-ocr tesseract-ocr-eng \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 ragservice \
    && mkdir /data \
    && chown ragservice:ragservice /data
USER ragservice
WORKDIR /home/ragservice
VOLUME ["/data"]

EXPOSE 8000
CMD ["ragservice", "serve", "--host", "0.0.0.0"]
