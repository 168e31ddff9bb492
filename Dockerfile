# The ragservice API server (and CLI), on CPU. See docker-compose.yml.
FROM python:3.11-slim

# No model downloads at run time (the default model ships in a Python package), and idle
# torch threads must not spin and steal CPU from the rest.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    OMP_WAIT_POLICY=PASSIVE

WORKDIR /src

# torch first, pinned and CPU-only: an unpinned torch pulls a multi-GB CUDA build.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md ./
COPY ragservice ./ragservice
COPY ingest ./ingest
COPY migrations ./migrations
RUN pip install . && rm -rf /src/build

RUN useradd --create-home --uid 10001 ragservice \
    && mkdir /data \
    && chown ragservice:ragservice /data
USER ragservice
WORKDIR /home/ragservice
ENV RAGSERVICE_DATA_DIR=/data
VOLUME ["/data"]

EXPOSE 8000
CMD ["ragservice", "serve", "--host", "0.0.0.0"]
