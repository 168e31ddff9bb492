"""Which model version an ingest writes vectors for, and the pipeline that does it.

An ingest embeds with the serving model by default. A bulk import may name another version
(`NAME[:VERSION]`): imported vectors are checked against that version's dimension and stored
for it; text documents in the same ingest are embedded with it only where this process can
load it (the CLI can; a server embeds with the model it serves, nothing else).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from ingest.pipeline import LOOKUP_BATCH, IngestPipeline
from ragservice.chunking import ChunkingOptions
from ragservice.db.models import EmbeddingModel
from ragservice.embedding.embedder import Embedder
from ragservice.embedding.registry import get_model_by_name, load_embedder, loadable
from ragservice.errors import ConfigurationError
from ragservice.runtime import Runtime, chunking_options


def resolve_model(runtime: Runtime, ref: str | None) -> EmbeddingModel | None:
    """The registered version `ref` names (NotFoundError listing the known ones), or None for
    the serving model."""
    if ref is None or not ref.strip():
        return None
    with runtime.db.read() as session:
        return get_model_by_name(session, ref.strip())


def ingest_pipeline(
    runtime: Runtime,
    *,
    tenant_id: uuid.UUID,
    model: EmbeddingModel | None = None,
    load_other: bool = False,
    embedder: Embedder | None = None,
    lookup_batch: int = LOOKUP_BATCH,
) -> IngestPipeline:
    """A pipeline writing vectors for `model` (default: the serving model, resolved once here
    and kept for the whole run). `load_other`: a version other than the serving one is loaded
    (lazily, on the first text document) to embed text; without it, text documents of such an
    ingest fail and only imported vectors are written. `embedder`: embed with this one instead
    (a stand-in such as the null embedder), whatever version the vectors are written for.
    `lookup_batch`: see `IngestPipeline`."""
    serving = runtime.models.current()
    if embedder is None:
        embedder = serving.embedder
        if model is not None and model.id != serving.id:
            wanted = load_other and loadable(model, runtime.settings.embedding)
            embedder = load_embedder(runtime.settings, model) if wanted else None
    model_id = serving.id if model is None else model.id
    dimension = serving.dimension if model is None else model.dimension
    return IngestPipeline(
        runtime.db,
        embedder,
        model_id=model_id,
        tenant_id=tenant_id,
        chunking=_chunking(runtime, embedder, dimension),
        batch_chunks=runtime.settings.ingest.batch_chunks,
        lookup_batch=lookup_batch,
    )


def _chunking(
    runtime: Runtime, embedder: Embedder | None, dimension: int
) -> Callable[[], ChunkingOptions]:
    """Chunking options, worked out (loading the model) when a text document first needs them."""

    def options() -> ChunkingOptions:
        assert embedder is not None
        if embedder.dimension != dimension:
            raise ConfigurationError(
                f"embedding model {embedder.name!r} gives {embedder.dimension} dimensions; "
                f"the version registered for it has {dimension}"
            )
        return chunking_options(runtime.settings.ingest, embedder.max_tokens)

    return options
