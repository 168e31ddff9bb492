"""What the retrievers share: the client they search with, and a hit's metadata."""

from __future__ import annotations

from typing import Any

from ragservice.client import RagserviceClient, SearchHit
from ragservice.extras import missing_extra

RETRIEVER_K = 4
"""Documents a retriever returns unless told: LangChain's and LlamaIndex's own default."""


def require(extra: str, module: str, cause: ImportError) -> ImportError:
    """The error for importing `module` without its extra: the `pip install` line."""
    return ImportError(missing_extra(extra, module) or str(cause))


def open_client(
    url: str | None, api_key: str | None, client: RagserviceClient | None, timeout: float
) -> RagserviceClient:
    """`client` if given, else a client of the server at `url` sending `api_key`."""
    if client is not None:
        return client
    if not url:
        raise ValueError("give the server's `url` (with an `api_key`) or a `client`")
    return RagserviceClient.connect(url, api_key=api_key, timeout=timeout)


def hit_metadata(hit: SearchHit) -> dict[str, Any]:
    """A hit's provenance, as a document's metadata: whose text it is and where it lies."""
    document: dict[str, Any] = dict(hit["document"])  # with the document's `metadata` too
    return {
        "document_id": document["external_id"],
        "document_uuid": document["id"],
        "title": document["title"],
        "collection": hit["collection"],
        "chunk_id": hit["chunk_id"],
        "ordinal": hit["ordinal"],
        "start_char": hit["start_char"],
        "end_char": hit["end_char"],
        "pages": hit.get("pages"),
        "score": hit["score"],
        "flagged": hit["flagged"],
        "document_metadata": document.get("metadata") or {},
    }
