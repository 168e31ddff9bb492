"""Typed SQLAlchemy models of the schema. Alembic migrations define the schema; these mirror it.

Every primary key and unique key of a tenant-owned table includes `tenant_id` (appended last
where it was missing), and a foreign key between two of them carries it on both sides
(`_tenant_key`; migration 0030): the tables can then be distributed by tenant. Rows are
identified by (id, tenant_id) accordingly.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, ClassVar

from pgvector.sqlalchemy import HALFVEC, Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    SmallInteger,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy import text as sql_text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ragservice.types import JobStatus


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSONB,
        uuid.UUID: UUID(as_uuid=True),
    }


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


def _tenant_key(
    table: str, column: str, parent: str, on_delete: str = "CASCADE"
) -> ForeignKeyConstraint:
    """`table.column` → `parent.id`, within the row's tenant: (column, tenant_id) → (id,
    tenant_id). SET NULL clears the reference only, never the tenant."""
    return ForeignKeyConstraint(
        [column, "tenant_id"],
        [f"{parent}.id", f"{parent}.tenant_id"],
        ondelete=f"SET NULL ({column})" if on_delete == "SET NULL" else on_delete,
        name=f"{table}_{column}_fkey",
    )


def _tenant_column() -> Mapped[uuid.UUID]:
    """The tenant of a row owned through its parent (no foreign key of its own: the key to
    the parent includes it)."""
    return mapped_column(UUID(as_uuid=True), nullable=False)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, server_default=func.gen_random_uuid())
    name: Mapped[str] = mapped_column(Text, unique=True)
    created_at: Mapped[datetime] = _now()


class Collection(Base):
    __tablename__ = "collections"
    __table_args__ = (
        PrimaryKeyConstraint("id", "tenant_id", name="collections_pkey"),
        UniqueConstraint("tenant_id", "name"),
    )

    id: Mapped[uuid.UUID] = mapped_column(server_default=func.gen_random_uuid())
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(Text)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", server_default="{}")
    cache_ttl_seconds: Mapped[int | None] = mapped_column(Integer)
    # What search does with chunks flagged as instruction-like: mark, downweight or drop.
    flagged_chunks: Mapped[str] = mapped_column(Text, server_default="downweight")
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class Document(Base):
    __tablename__ = "documents"
    __table_args__ = (
        PrimaryKeyConstraint("id", "tenant_id", name="documents_pkey"),
        UniqueConstraint("collection_id", "external_id", "tenant_id"),
        _tenant_key("documents", "collection_id", "collections"),
    )

    id: Mapped[uuid.UUID] = mapped_column(server_default=func.gen_random_uuid())
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    collection_id: Mapped[uuid.UUID]
    external_id: Mapped[str] = mapped_column(Text)
    title: Mapped[str | None] = mapped_column(Text)
    source: Mapped[str | None] = mapped_column(Text)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", server_default="{}")
    content_hash: Mapped[str] = mapped_column(Text)
    version: Mapped[int] = mapped_column(Integer, server_default="1")
    chunk_count: Mapped[int] = mapped_column(Integer, server_default="0")
    char_count: Mapped[int] = mapped_column(Integer, server_default="0")
    # Who may read it: `user:<name>` and `group:<name>`; None: the whole tenant (migration 0026).
    readers: Mapped[list[str] | None] = mapped_column(ARRAY(Text), nullable=True)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class Chunk(Base):
    __tablename__ = "chunks"
    __table_args__ = (
        PrimaryKeyConstraint("id", "tenant_id", name="chunks_pkey"),
        UniqueConstraint("document_id", "ordinal", "tenant_id"),
        Index("chunks_seq_key", "seq", "tenant_id", unique=True),
        _tenant_key("chunks", "collection_id", "collections"),
        _tenant_key("chunks", "document_id", "documents"),
    )

    id: Mapped[uuid.UUID]
    # The compact key the BM25 postings carry (8 bytes, not the uuid's 16).
    seq: Mapped[int] = mapped_column(BigInteger, Identity(always=False))
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    collection_id: Mapped[uuid.UUID]
    document_id: Mapped[uuid.UUID]
    ordinal: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    token_count: Mapped[int] = mapped_column(Integer)
    content_hash: Mapped[str] = mapped_column(Text)
    start_char: Mapped[int] = mapped_column(Integer)
    end_char: Mapped[int] = mapped_column(Integer)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", server_default="{}")
    # The pages (1-based, inclusive) of a paged document (a PDF) the chunk lies on; null for
    # a document without pages (migration 0016).
    page_start: Mapped[int | None] = mapped_column(Integer)
    page_end: Mapped[int | None] = mapped_column(Integer)
    # Its document's readers, copied (row-level security reads them per row; migration 0026).
    readers: Mapped[list[str] | None] = mapped_column(ARRAY(Text), nullable=True)


class EmbeddingModel(Base):
    __tablename__ = "embedding_models"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(Text)
    version: Mapped[int] = mapped_column(Integer, server_default="1")
    dimension: Mapped[int] = mapped_column(Integer)
    path: Mapped[str | None] = mapped_column(Text)
    active: Mapped[bool] = mapped_column(Boolean, server_default="false")
    created_at: Mapped[datetime] = _now()
    base_model_id: Mapped[int | None] = mapped_column(ForeignKey("embedding_models.id"))
    # What made it: training data, held-out evaluation before and after, timings.
    details: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")
    # How its chunk vectors are kept and indexed: float32, halfvec or binary (migration 0015).
    storage: Mapped[str] = mapped_column(Text, server_default="float32")


class RerankerModel(Base):
    """A cross-encoder trained by `ragservice finetune --reranker` (migration 0018)."""

    __tablename__ = "reranker_models"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(Text)
    version: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    base: Mapped[str] = mapped_column(Text)
    # What made it: training data, held-out figures, timings, hyperparameters.
    details: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")
    created_at: Mapped[datetime] = _now()


class ModelActivation(Base):
    """One switch of the active embedding model; rollback goes back one step."""

    __tablename__ = "model_activations"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("embedding_models.id", ondelete="CASCADE"))
    previous_model_id: Mapped[int | None] = mapped_column(
        ForeignKey("embedding_models.id", ondelete="SET NULL")
    )
    activated_at: Mapped[datetime] = _now()


class ChunkEmbedding(Base):
    __tablename__ = "chunk_embeddings"
    __table_args__ = (
        PrimaryKeyConstraint("chunk_id", "model_id", "tenant_id", name="chunk_embeddings_pkey"),
        _tenant_key("chunk_embeddings", "chunk_id", "chunks"),
        Index(
            "chunk_embeddings_readers",
            "readers",
            postgresql_using="gin",
            postgresql_where=sql_text("readers IS NOT NULL"),
        ),
        Index(
            "chunk_embeddings_unrestricted",
            "model_id",
            postgresql_where=sql_text("readers IS NULL"),
        ),
    )

    chunk_id: Mapped[uuid.UUID]
    model_id: Mapped[int] = mapped_column(ForeignKey("embedding_models.id", ondelete="CASCADE"))
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    # The chunk's collection and readers, copied so that a restricted or filtered dense search
    # can read only the vectors it may return (migration 0034; set by `INSERT_STAGED`, kept by
    # the documents' readers trigger).
    collection_id: Mapped[uuid.UUID]
    readers: Mapped[list[str] | None] = mapped_column(ARRAY(Text), nullable=True)
    # No fixed dimension: models of different sizes live side by side, each with its own
    # partial HNSW index over `embedding::vector(dim)` (see migration 0001). A model stored as
    # halfvec keeps its vectors in `embedding_half` instead (exactly one is set; migration 0015).
    embedding: Mapped[Any] = mapped_column(Vector(), nullable=True)
    embedding_half: Mapped[Any] = mapped_column(HALFVEC(), nullable=True)


class IngestJob(Base):
    __tablename__ = "ingest_jobs"
    __table_args__ = (
        PrimaryKeyConstraint("id", "tenant_id", name="ingest_jobs_pkey"),
        _tenant_key("ingest_jobs", "collection_id", "collections"),
        _tenant_key("ingest_jobs", "source_id", "sources", on_delete="SET NULL"),
    )

    id: Mapped[uuid.UUID] = mapped_column(server_default=func.gen_random_uuid())
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    collection_id: Mapped[uuid.UUID | None]
    kind: Mapped[str] = mapped_column(Text, server_default="cli")
    status: Mapped[str] = mapped_column(Text, server_default=JobStatus.QUEUED.value)
    params: Mapped[dict[str, Any]] = mapped_column(server_default="{}")
    counts: Mapped[dict[str, Any]] = mapped_column(server_default="{}")
    errors: Mapped[Any] = mapped_column(JSONB, server_default="[]")
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    worker: Mapped[str | None] = mapped_column(Text)
    # The advisory lock its worker holds while it runs (migration 0019, db/locks.py).
    claim_key: Mapped[int | None] = mapped_column(BigInteger)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Who queued it, and whether it named readers or wrote a document that has some: then only
    # its asker and those who read every document see it (migration 0026).
    asker: Mapped[str | None] = mapped_column(Text)
    restricted: Mapped[bool] = mapped_column(Boolean, server_default="false")
    # Whose documents it may replace: the principal set of its queuer (migration 0028; `{}`:
    # the unrestricted documents only; NULL: every document of the tenant).
    writes_as: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    # The source a run job syncs (migration 0027); at most one queued or running per source.
    source_id: Mapped[uuid.UUID | None]
    created_at: Mapped[datetime] = _now()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Source(Base):
    """A web site, an S3-compatible bucket or a folder a collection is kept in sync with
    (migration 0027; `ingest.sources`)."""

    __tablename__ = "sources"
    __table_args__ = (
        PrimaryKeyConstraint("id", "tenant_id", name="sources_pkey"),
        UniqueConstraint("collection_id", "location", "tenant_id"),
        _tenant_key("sources", "collection_id", "collections"),
    )

    id: Mapped[uuid.UUID] = mapped_column(server_default=func.gen_random_uuid())
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    collection_id: Mapped[uuid.UUID]
    kind: Mapped[str] = mapped_column(Text)
    location: Mapped[str] = mapped_column(Text)
    options: Mapped[dict[str, Any]] = mapped_column(server_default="{}")
    readers: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    # Whose documents its runs may replace: the principal set of who added it (migration 0028).
    writes_as: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    # The user name and password (or S3 keys) it is read with, split off `location` when it was
    # added (migration 0029; `ingest.sources.credentials`): used to fetch, never shown.
    credentials: Mapped[dict[str, Any] | None] = mapped_column(JSONB(none_as_null=True))
    every_seconds: Mapped[int | None] = mapped_column(Integer)
    prune: Mapped[bool] = mapped_column(Boolean, server_default="true")
    next_run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()


class SourceItem(Base):
    """What a source knew of one document at its last run (`ItemState` as JSON)."""

    __tablename__ = "source_items"
    __table_args__ = (
        PrimaryKeyConstraint("source_id", "key", "tenant_id", name="source_items_pkey"),
        _tenant_key("source_items", "source_id", "sources"),
    )

    source_id: Mapped[uuid.UUID]
    key: Mapped[str] = mapped_column(Text)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    state: Mapped[dict[str, Any]] = mapped_column(server_default="{}")
    external_id: Mapped[str | None] = mapped_column(Text)
    seen_at: Mapped[datetime] = _now()


class ChunkPosting(Base):
    """A block of BM25 postings of one (collection, lexeme, impact tier): up to 128 chunks'
    `seq`s with their term frequencies and lengths, and the block's largest tf and smallest length
    (what bounds its best BM25 score). Triggers on `chunks` keep it current."""

    __tablename__ = "chunk_postings"
    __table_args__ = (
        # INCLUDE (last_seq, n, max_tf, min_len): a term's blocks and bounds from the index alone.
        PrimaryKeyConstraint(
            "collection_id", "lexeme", "tier", "first_seq", "tenant_id", name="chunk_postings_pkey"
        ),
        _tenant_key("chunk_postings", "collection_id", "collections"),
    )

    collection_id: Mapped[uuid.UUID]
    lexeme: Mapped[str] = mapped_column(Text(collation="C"))
    tier: Mapped[int] = mapped_column(SmallInteger)
    first_seq: Mapped[int] = mapped_column(BigInteger)
    last_seq: Mapped[int] = mapped_column(BigInteger)
    n: Mapped[int] = mapped_column(Integer)
    seqs: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    tfs: Mapped[list[int]] = mapped_column(ARRAY(SmallInteger))
    lengths: Mapped[list[int]] = mapped_column(ARRAY(Integer))
    max_tf: Mapped[int] = mapped_column(SmallInteger)
    min_len: Mapped[int] = mapped_column(Integer)
    tenant_id: Mapped[uuid.UUID] = _tenant_column()


class CollectionTextStats(Base):
    """Chunk and token totals per collection (the sum of its rows), BM25's N and average length."""

    __tablename__ = "collection_text_stats"
    __table_args__ = (
        PrimaryKeyConstraint(
            "collection_id", "slot", "tenant_id", name="collection_text_stats_pkey"
        ),
        _tenant_key("collection_text_stats", "collection_id", "collections"),
    )

    collection_id: Mapped[uuid.UUID]
    slot: Mapped[int] = mapped_column(Integer, server_default="0")
    """The writing backend's pid (0: totals folded by a pack); a collection's rows add up."""
    chunk_count: Mapped[int] = mapped_column(BigInteger)
    token_count: Mapped[int] = mapped_column(BigInteger)
    tenant_id: Mapped[uuid.UUID] = _tenant_column()


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, server_default=func.gen_random_uuid())
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str | None] = mapped_column(Text)
    prefix: Mapped[str] = mapped_column(Text)
    key_hash: Mapped[str] = mapped_column(Text, unique=True)
    role: Mapped[str] = mapped_column(Text)
    # The user the key acts for: it reads what that user may (None: no user; migration 0026).
    user_name: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class IngestJobItem(Base):
    """A file or a text an upload brought, waiting in PostgreSQL for a worker."""

    __tablename__ = "ingest_job_items"
    __table_args__ = (
        PrimaryKeyConstraint("job_id", "ordinal", "tenant_id", name="ingest_job_items_pkey"),
        _tenant_key("ingest_job_items", "job_id", "ingest_jobs"),
    )

    job_id: Mapped[uuid.UUID]
    ordinal: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(Text)
    title: Mapped[str | None] = mapped_column(Text)
    body: Mapped[bytes] = mapped_column(LargeBinary)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", server_default="{}")
    # The readers the document is to get (None: as stored, or the whole tenant when new).
    readers: Mapped[list[str] | None] = mapped_column(ARRAY(Text), nullable=True)
    tenant_id: Mapped[uuid.UUID] = _tenant_column()


class GroupMember(Base):
    """A user's membership of a group of its tenant (migration 0026)."""

    __tablename__ = "group_members"

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    group_name: Mapped[str] = mapped_column(Text, primary_key=True)
    user_name: Mapped[str] = mapped_column(Text, primary_key=True)
    created_at: Mapped[datetime] = _now()


class QueryLog(Base):
    """One answered question: what was retrieved, the answer, and where the time went."""

    __tablename__ = "query_log"
    __table_args__ = (PrimaryKeyConstraint("id", "tenant_id", name="query_log_pkey"),)

    id: Mapped[uuid.UUID] = mapped_column(server_default=func.gen_random_uuid())
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    endpoint: Mapped[str] = mapped_column(Text)
    question: Mapped[str] = mapped_column(Text)
    collection_ids: Mapped[list[uuid.UUID]] = mapped_column(
        ARRAY(UUID(as_uuid=True)), server_default="{}"
    )
    params: Mapped[dict[str, Any]] = mapped_column(server_default="{}")
    retrieved: Mapped[Any] = mapped_column(JSONB, server_default="[]")
    answer: Mapped[str | None] = mapped_column(Text)
    citations: Mapped[Any] = mapped_column(JSONB, server_default="[]")
    timings: Mapped[dict[str, Any]] = mapped_column(server_default="{}")
    upstream_model: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    cache: Mapped[Any] = mapped_column(JSONB, nullable=True)
    # The messages the answer was generated from (or would have been, for an extractive one);
    # null for answers replayed from the cache.
    messages: Mapped[Any] = mapped_column(JSONB, nullable=True)
    # The documents retrieved or shown to the model; deleting one redacts answer and messages.
    source_document_ids: Mapped[list[uuid.UUID]] = mapped_column(
        ARRAY(UUID(as_uuid=True)), server_default="{}"
    )
    redacted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The request's X-Request-ID and, while tracing is on, its trace id (32 hex digits).
    request_id: Mapped[str | None] = mapped_column(Text)
    trace_id: Mapped[str | None] = mapped_column(Text)
    # Who asked: `user:<name>`, else `key:<prefix>` (None: no key, or before migration 0026).
    asker: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class Feedback(Base):
    """What a user said about one answer: a rating, a comment, a better answer, and which of
    the retrieved chunks were relevant or not."""

    __tablename__ = "feedback"
    __table_args__ = (
        PrimaryKeyConstraint("id", "tenant_id", name="feedback_pkey"),
        _tenant_key("feedback", "query_id", "query_log"),
    )

    id: Mapped[uuid.UUID] = mapped_column(server_default=func.gen_random_uuid())
    query_id: Mapped[uuid.UUID]
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    rating: Mapped[int | None] = mapped_column(SmallInteger)
    scale: Mapped[str] = mapped_column(Text, server_default="thumbs")  # "thumbs" | "stars"
    comment: Mapped[str | None] = mapped_column(Text)
    corrected_answer: Mapped[str | None] = mapped_column(Text)
    relevant_chunk_ids: Mapped[list[uuid.UUID]] = mapped_column(
        ARRAY(UUID(as_uuid=True)), server_default="{}"
    )
    irrelevant_chunk_ids: Mapped[list[uuid.UUID]] = mapped_column(
        ARRAY(UUID(as_uuid=True)), server_default="{}"
    )
    key_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    asker: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class PromptCacheEntry(Base):
    """A cached answer, served only within its scope and only until `expires_at`."""

    __tablename__ = "prompt_cache"
    __table_args__ = (
        PrimaryKeyConstraint("id", "tenant_id", name="prompt_cache_pkey"),
        UniqueConstraint(
            "scope",
            "prompt_hash",
            "source_documents",
            "built_for",
            "tenant_id",
            name="prompt_cache_scope_prompt_sources_key",
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(server_default=func.gen_random_uuid())
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    scope: Mapped[str] = mapped_column(Text)
    model_id: Mapped[int] = mapped_column(ForeignKey("embedding_models.id", ondelete="CASCADE"))
    collection_ids: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)))
    prompt_hash: Mapped[str] = mapped_column(Text)
    prompt: Mapped[str] = mapped_column(Text)
    embedding: Mapped[Any] = mapped_column(Vector())
    answer: Mapped[str] = mapped_column(Text)
    response: Mapped[Any] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _now()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    hits: Mapped[int] = mapped_column(Integer, server_default="0")
    last_hit_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The documents it was built from: it is served only to askers who may read them all.
    source_documents: Mapped[list[uuid.UUID]] = mapped_column(
        ARRAY(UUID(as_uuid=True)), server_default="{}"
    )
    # The principal set of the asker it was built for (`{*}`: one who reads every document):
    # served to askers who read no more than that one, whose own search would find the same.
    built_for: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default="{*}")


class PromptCacheSource(Base):
    """A document (at a version) a cache entry was built from; a newer version invalidates it."""

    __tablename__ = "prompt_cache_sources"
    __table_args__ = (
        PrimaryKeyConstraint(
            "entry_id", "document_id", "tenant_id", name="prompt_cache_sources_pkey"
        ),
        _tenant_key("prompt_cache_sources", "entry_id", "prompt_cache"),
    )

    entry_id: Mapped[uuid.UUID]
    document_id: Mapped[uuid.UUID]
    document_version: Mapped[int] = mapped_column(Integer)
    tenant_id: Mapped[uuid.UUID] = _tenant_column()


class AnalystTenant(Base):
    """The tenant an analyst login may read in the analytics views (None: every tenant). Read
    by the views with their owner's rights; neither analysts nor the service role may read it."""

    __tablename__ = "analyst_tenants"

    role_name: Mapped[str] = mapped_column(Text, primary_key=True)
    tenant_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), nullable=True
    )
    created_at: Mapped[datetime] = _now()


class AuditEntry(Base):
    """One administrative action: who (`actor`, and `key_id` for an API key) did `action` to
    `target`. Append-only for the service role; no tenant for deployment-wide actions."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    at: Mapped[datetime] = _now()
    tenant_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), nullable=True
    )
    key_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    actor: Mapped[str] = mapped_column(Text)
    action: Mapped[str] = mapped_column(Text)
    target: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(server_default="{}")
