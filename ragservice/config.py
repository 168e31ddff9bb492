"""Service configuration: environment variables prefixed `RAGSERVICE_`, read by `get_settings()`."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_TENANT_ID = "00000000-0000-0000-0000-000000000001"
DEFAULT_TENANT_NAME = "default"
"""The name of tenant `DEFAULT_TENANT_ID` (migration 0001): the CLI's tenant unless told."""
DEFAULT_EF_SEARCH = {"float32": 100, "halfvec": 100, "binary": 40}
"""HNSW ef_search per vector storage when no setting names one (docs/benchmarks.md: the
recall@10 / latency curve of `benchmarks/scale.py`'s `recall_vs_ef`). float32 and halfvec: 100
(recall 0.96 at 40, 0.98 at 100, 0.99 at 200 for +50% p95); binary: 40, since its recall is set
by the re-scored candidates (`binary_rescore_factor`), which ef_search is raised to anyway."""


class Settings(BaseSettings):
    """Every setting of the service; the README's configuration table lists them all."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVICE_", extra="ignore")

    # Secrets are SecretStr: a repr, a log line or an error message of the settings shows ***.
    database_url: SecretStr | None = Field(
        default=None, description="PostgreSQL URL; unset starts the embedded server"
    )
    owner_database_url: SecretStr | None = Field(
        default=None,
        description="the schema owner's PostgreSQL URL, for migrations and operator commands; "
        "unset: RAGSERVICE_DATABASE_URL (the embedded server's administrator when that is unset)",
    )
    data_dir: Path = Field(
        default=Path(".ragservice"), description="embedded PostgreSQL data, ONNX cache"
    )
    embedded_supervise: bool = Field(
        default=True,
        description="serve and worker start the embedded PostgreSQL again when it exits",
    )
    embedded_check_seconds: float = Field(
        default=0.5, gt=0, le=60, description="how often the embedded PostgreSQL is looked at"
    )
    embedded_restart_max_backoff_seconds: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        description="the longest wait between attempts to start a failing embedded PostgreSQL",
    )
    embedded_pg_settings: str = Field(
        default="",
        description="the embedded PostgreSQL's settings as name=value pairs, comma-separated "
        "(e.g. shared_buffers=2GB,max_wal_size=16GB), over those sized for the machine; "
        "`ragservice db settings` lists the names",
    )
    region: str | None = Field(
        default=None, description="this server's region; reads prefer that region's replicas"
    )
    replicas: SecretStr | None = Field(
        default=None,
        description="read replicas as comma-separated region=URL pairs (eu=postgresql://…)",
    )
    replica_max_lag_seconds: float = Field(
        default=5.0, gt=0, description="a replica further behind than this serves no reads"
    )
    replica_wait_seconds: float = Field(
        default=0.5,
        ge=0,
        description="how long a read with a consistency token waits for a replica to catch up "
        "before it goes to the primary",
    )
    replica_check_seconds: float = Field(
        default=1.0, gt=0, description="how often each replica's health and lag are checked"
    )
    replica_connect_timeout: int = Field(
        default=2, ge=2, description="connect timeout to a replica, in whole seconds"
    )
    embedding_model: str = Field(default=DEFAULT_EMBEDDING_MODEL)
    model_check_seconds: float = Field(
        default=2.0,
        gt=0,
        description="how often a server checks which embedding model is active (and switches)",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    embed_batch_size: int = Field(default=64, ge=1, le=4096)
    chunk_max_tokens: int | None = Field(
        default=None, ge=8, description="unset: the embedding model's max sequence"
    )
    chunk_overlap_tokens: int = Field(default=32, ge=0)
    ingest_batch_chunks: int = Field(
        default=2048,
        ge=1,
        description="chunks per embedding window and write transaction during ingest",
    )
    hnsw_m: int = Field(default=16, ge=2, le=100)
    hnsw_ef_construction: int = Field(default=64, ge=4, le=1000)
    hnsw_ef_search: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="HNSW candidate list per query (raised to k) for every storage; unset: "
        "each storage's own (`hnsw_ef_search_<storage>`, else its built-in default)",
    )
    hnsw_ef_search_float32: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="ef_search of a float32 model; wins over "
        "`hnsw_ef_search`; unset: that, else 100",
    )
    hnsw_ef_search_halfvec: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="ef_search of a halfvec model; wins over "
        "`hnsw_ef_search`; unset: that, else 100",
    )
    hnsw_ef_search_binary: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="ef_search of a binary model's bit index; "
        "wins over `hnsw_ef_search`; unset: that, else 40",
    )
    vector_storage: Literal["float32", "halfvec", "binary"] = Field(
        default="float32",
        description="how a newly registered model version keeps its chunk vectors: float32 "
        "(vector), halfvec (float16, half the bytes) or binary (float32 kept, a bit index, "
        "candidates re-scored); `ragservice models convert` changes a version's",
    )
    binary_rescore_factor: int = Field(
        default=4,
        ge=1,
        le=100,
        description="binary storage: candidates read from the bit index per result asked, "
        "then re-scored by the full vectors' cosine",
    )
    index_build_memory_mb: int = Field(
        default=0,
        ge=0,
        description="maintenance_work_mem of an HNSW index build; 0: a quarter of the "
        "memory available on this machine, at most 16 GB",
    )
    index_build_workers: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="parallel maintenance workers of an HNSW index build; unset: cores - 1",
    )
    search_rrf_k: int = Field(
        default=30, ge=1, le=1000, description="reciprocal rank fusion constant"
    )
    search_dense_candidates: int = Field(
        default=100, ge=1, le=1000, description="dense candidates fused by hybrid search"
    )
    search_text_candidates: int = Field(
        default=100, ge=1, le=1000, description="full-text candidates fused by hybrid search"
    )
    search_fusion: Literal["rrf", "minmax", "zscore", "dbsf"] = Field(
        default="zscore",
        description="how hybrid search fuses its two candidate lists: reciprocal rank fusion, "
        "or normalised scores (min-max, z-score, distribution-based) weighted and summed",
    )
    search_text_weight: float = Field(
        default=0.5, ge=0, le=1, description="hybrid: the full-text side's weight in fusion"
    )
    search_adaptive_weight: bool = Field(
        default=False,
        description="hybrid: weigh each side per query by how peaked its scores are",
    )
    search_prf: Literal["off", "rm3"] = Field(
        default="off", description="pseudo-relevance feedback for full text (BM25): off or RM3"
    )
    search_prf_docs: int = Field(
        default=10, ge=1, le=50, description="RM3: first-pass chunks the expansion comes from"
    )
    search_prf_terms: int = Field(
        default=20, ge=1, le=50, description="RM3: lexemes added to the query at most"
    )
    search_prf_query_weight: float = Field(
        default=0.7, ge=0, le=1, description="RM3: the original query's share of the weight"
    )
    search_document_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="document results: each of a document's next 2 best chunks adds this "
        "share of its score to the best chunk's (0: documents rank by their best chunk)",
    )
    bm25_k1: float = Field(default=0.9, ge=0, le=10)
    bm25_b: float = Field(default=0.4, ge=0, le=1)
    bm25_postings_per_term: int = Field(
        default=2_000,
        ge=1,
        description="BM25 postings read per query term, highest impact first (exact below it), "
        "where full text is not exact",
    )
    bm25_exact: bool = Field(
        default=True,
        description="unfiltered full text is exact BM25 where the database has the "
        "ragservice_bm25 extension; false: the budgeted SQL statement always (faster on "
        "collections of a million chunks, see docs/benchmarks.md)",
    )
    query_encoder: Literal["auto", "onnx", "torch"] = Field(
        default="auto", description="how single queries are embedded; auto: ONNX on CPU"
    )
    embedding_precision: Literal["float", "int8"] = Field(
        default="float",
        description="int8: ONNX Runtime dynamic int8 on CPU for ingest batches and queries "
        "(vectors within cosine 0.99 of float); ignored on CUDA (fp16 there)",
    )
    reranker: str | None = Field(
        default=None, description="a cross-encoder name or path; unset: no reranking"
    )
    rerank_candidates: int = Field(
        default=30, ge=1, le=1000, description="search results the reranker rescores"
    )
    context_max_tokens: int = Field(
        default=1500, ge=16, description="token budget of the sources handed to the model"
    )
    context_neighbours: int = Field(
        default=0, ge=0, le=5, description="chunks added on each side of a hit for continuity"
    )
    inference_url: str | None = Field(
        default=None, description="OpenAI-compatible base URL; unset: extractive answers"
    )
    inference_model: str = Field(default="default", description="model name sent upstream")
    inference_api_key: SecretStr | None = None
    inference_connect_timeout: float = Field(default=5.0, gt=0)
    inference_read_timeout: float = Field(default=60.0, gt=0)
    inference_max_retries: int = Field(default=2, ge=0, le=10)
    inference_max_tokens: int = Field(default=512, ge=1)
    inference_temperature: float = Field(default=0.1, ge=0, le=2)
    system_prompt: str | None = Field(
        default=None, description="instructions for the model; unset: the built-in prompt"
    )
    answer_link_hosts: str = Field(
        default="",
        description="comma-separated hosts that links and images in answers may point to "
        "(a host allows its subdomains); any other link or image is removed, its text kept; "
        "empty: every absolute link",
    )
    answer_html: Literal["strip", "escape", "keep"] = Field(
        default="strip",
        description="HTML in answers and in the chat `Sources:` list: strip (nh3 takes out "
        "script, style, svg, iframe, images, event handlers and other active markup; safe "
        "formatting tags and all Markdown stay), escape (every tag written as text: &lt;b&gt;) "
        "or keep (as the model wrote it)",
    )
    chat_sources_block: bool = Field(
        default=True,
        description="end /v1/chat/completions answers with a `Sources:` list of the cited "
        "sources (a request's `sources_block` overrides it; `citations` carry them either way)",
    )
    cache_enabled: bool = Field(default=True, description="the semantic prompt cache")
    cache_similarity_threshold: float = Field(
        default=0.90, ge=0, le=1, description="cosine similarity a semantic cache hit needs"
    )
    cache_ttl_seconds: int = Field(
        default=86400, ge=1, description="entry lifetime from creation (collections may override)"
    )
    cache_purge_seconds: float = Field(
        default=300.0, gt=0, description="how often expired cache entries are deleted"
    )
    max_k: int = Field(default=200, ge=1, le=1000, description="largest k a search may ask")
    max_query_chars: int = Field(default=4000, ge=1)
    max_body_bytes: int = Field(default=64 * 2**20, ge=1024, description="largest request body")
    max_file_bytes: int = Field(default=32 * 2**20, ge=1, description="largest uploaded file")
    max_files_per_upload: int = Field(default=1000, ge=1)
    max_document_pages: int = Field(
        default=2000, ge=1, description="a PDF with more pages is refused (a per-file error)"
    )
    max_document_chars: int = Field(
        default=5_000_000,
        ge=1,
        description="a document whose extracted text is longer is refused (a per-file error)",
    )
    allow_no_row_security: bool = Field(
        default=False,
        description="serve even when row-level security cannot bind the service: its roles "
        "are missing, or its login is a superuser, BYPASSRLS or the tables' owner (only the "
        "tenant checks in code then hold)",
    )
    parse_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description="CPU and wall-clock seconds parsing one file may take (a per-file error)",
    )
    parse_memory_mib: int = Field(
        default=2048,
        ge=128,
        description="address space of the process that parses files (more: a per-file error)",
    )
    max_batch_items: int = Field(
        default=2048,
        ge=1,
        description="texts in one JSON request: documents of an upload (for /v1/embeddings "
        "also RAGSERVICE_MAX_EMBEDDING_INPUTS)",
    )
    rate_limit_per_second: float = Field(
        default=20.0,
        ge=0,
        description="sustained tokens per second per API key (a request costs 1 or more, "
        "see docs/api.md); 0: no limit",
    )
    rate_limit_burst: int = Field(
        default=40, ge=1, description="tokens a key may spend at once before the rate applies"
    )
    max_concurrent_embeddings: int | None = Field(
        default=None,
        ge=1,
        description="embedding computations at once per loaded model (more wait their turn); "
        "unset: the CPUs this process may use",
    )
    max_concurrent_upstream: int = Field(
        default=16,
        ge=1,
        description="calls to the inference layer at once per process (more wait, within "
        "the call's deadline)",
    )
    max_concurrent_upstream_per_tenant: int | None = Field(
        default=None,
        ge=1,
        description="of those, the most one tenant holds at once; unset: all but one (one is "
        "always left for other tenants). Free slots go to the waiting tenant holding fewest",
    )
    max_answer_tokens: int = Field(
        default=2048,
        ge=1,
        description="largest max_tokens (max_completion_tokens) a chat request may ask; "
        "more is refused (422)",
    )
    max_chat_messages: int = Field(
        default=50,
        ge=1,
        description="messages in one /v1/chat/completions request (the history and the question)",
    )
    max_chat_chars: int = Field(
        default=32_000,
        ge=1,
        description="characters of the messages forwarded upstream from one chat request",
    )
    max_embedding_inputs: int = Field(
        default=256, ge=1, description="texts in one /v1/embeddings request"
    )
    max_embedding_input_chars: int = Field(
        default=8_000, ge=1, description="characters of one /v1/embeddings text"
    )
    max_embedding_request_chars: int = Field(
        default=500_000,
        ge=1,
        description="characters of all the texts of one /v1/embeddings request",
    )
    embedding_token_ids: Literal["tiktoken", "model"] = Field(
        default="tiktoken",
        description="whose ids /v1/embeddings token arrays are: tiktoken's (OpenAI-style "
        "clients, LangChain), decoded to text; or the embedding model's own tokenizer's",
    )
    embedding_tiktoken_encoding: str = Field(
        default="cl100k_base",
        min_length=1,
        description="the tiktoken encoding token arrays are decoded with (tiktoken mode)",
    )
    auth_disabled: bool = Field(
        default=False, description="serve without API keys; refused unless bound to loopback"
    )
    console: bool = Field(
        default=True, description="serve the web console at /ui (it calls the API with a key)"
    )
    auth_failures_per_minute: int = Field(
        default=30,
        ge=0,
        description="requests with a wrong, revoked or expired API key a client address may "
        "make per minute (bursts of as many); beyond, 429 without a database read; 0: no limit",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="when set, GET /metrics needs `Authorization: Bearer <this token>`",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="serve /metrics on this port of RAGSERVICE_METRICS_HOST instead of the API's",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="bind address of the metrics port (RAGSERVICE_METRICS_PORT) and of "
        "`ragservice worker`'s (RAGSERVICE_WORKER_METRICS_PORT)",
    )
    worker_metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="`ragservice worker` serves Prometheus metrics on this port of "
        "RAGSERVICE_METRICS_HOST; unset: none (0: any free port)",
    )
    workers: int = Field(default=1, ge=0, le=64, description="ingest job threads per server")
    job_poll_seconds: float = Field(default=1.0, gt=0)
    job_stale_seconds: float = Field(
        default=120.0, gt=0, description="a running job without a heartbeat this long is retried"
    )
    job_max_attempts: int = Field(default=3, ge=1)
    shutdown_grace_seconds: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="on SIGTERM or SIGINT, `serve` and `worker` end open streamed answers, "
        "put their running jobs back in the queue and stop (the embedded PostgreSQL too) "
        "within this many seconds",
    )
    query_log_retention_days: int = Field(
        default=90,
        ge=0,
        description="logged questions, answers and prompts older than this are deleted with "
        "their feedback; 0 keeps them for ever",
    )
    job_payload_retention_hours: float = Field(
        default=24.0,
        ge=0,
        description="the uploaded files and texts of a failed job are dropped this long after "
        "it ended (a done job drops them at once); 0: at the next purge",
    )
    retention_purge_seconds: float = Field(
        default=3600.0, gt=0, description="how often a server runs the retention purge"
    )
    analyst_statement_timeout_seconds: int = Field(
        default=60,
        ge=1,
        description="statement and idle-in-transaction timeout `ragservice analysts add` gives "
        "each analyst login (ALTER ROLE ... SET)",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    log_level: str = "INFO"
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="text: `LEVEL logger: message`; json: a JSON object a line, with the "
        "request's id, tenant and route",
    )
    tracing: bool = Field(
        default=False,
        description="OpenTelemetry traces of requests (the `otel` extra), exported as the "
        "standard OTEL_* variables say",
    )

    @model_validator(mode="after")
    def _overlap_below_chunk_size(self) -> Settings:
        if self.chunk_max_tokens is not None and (
            self.chunk_overlap_tokens >= self.chunk_max_tokens // 2
        ):
            raise ValueError("RAGSERVICE_CHUNK_OVERLAP_TOKENS must be below half the chunk size")
        return self

    @model_validator(mode="after")
    def _replicas_parse(self) -> Settings:
        self.replica_urls()
        return self

    def ef_search_by_storage(self) -> dict[str, int]:
        """The HNSW ef_search of each vector storage: `hnsw_ef_search_<storage>`, else
        `hnsw_ef_search` (one value for all, as before), else `DEFAULT_EF_SEARCH`."""
        return {
            storage: getattr(self, f"hnsw_ef_search_{storage}") or self.hnsw_ef_search or default
            for storage, default in DEFAULT_EF_SEARCH.items()
        }

    def link_hosts(self) -> frozenset[str]:
        """`RAGSERVICE_ANSWER_LINK_HOSTS` as lower-case host names."""
        hosts = (host.strip().lower().rstrip(".") for host in self.answer_link_hosts.split(","))
        return frozenset(host for host in hosts if host)

    def replica_urls(self) -> list[tuple[str, str]]:
        """`RAGSERVICE_REPLICAS` as (region, URL) pairs, in the order given."""
        return parse_replicas(self.replicas.get_secret_value() if self.replicas else "")


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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings()


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (`localhost`, 127.0.0.0/8, ::1): where a server
    may run without authentication and plain http may carry a key."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
