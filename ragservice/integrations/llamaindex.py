"""A LlamaIndex retriever over ragservice's search API (needs the `llamaindex` extra).

```python
from ragservice.integrations.llamaindex import RagserviceRetriever

retriever = RagserviceRetriever(
    url="http://127.0.0.1:8000", api_key="rsk_...", collections=["handbook"], k=4
)
for found in retriever.retrieve("How long is parental leave?"):
    print(found.node.metadata["title"], found.score, found.node.get_content())
```

Each hit becomes a `NodeWithScore`: a `TextNode` (id: the chunk's id; text: the chunk's; metadata
as the LangChain retriever's: `document_id`, `title`, `collection`, `chunk_id`, `pages`, …) with
the hit's score. Only `title` is shown to a model with the text (the rest stays metadata). The
API key scopes the search as any REST call."""

from __future__ import annotations

from typing import Any

from ragservice.client import Mode, RagserviceClient
from ragservice.integrations.hits import RETRIEVER_K, hit_metadata, open_client, require

try:
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as exc:
    raise require("llamaindex", "ragservice.integrations.llamaindex", exc) from exc


class RagserviceRetriever(BaseRetriever):
    """The `k` best chunks of `collections` (unset: all the key's tenant has) for a query."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        client: RagserviceClient | None = None,
        collections: list[str] | None = None,
        k: int = RETRIEVER_K,
        mode: Mode = "hybrid",
        filters: dict[str, Any] | None = None,
        timeout: float = 60.0,
        callback_manager: CallbackManager | None = None,
    ) -> None:
        if k < 1:
            raise ValueError("k must be at least 1")
        self._rest = open_client(url, api_key, client, timeout)
        self._owned = client is None
        self.collections, self.k, self.mode, self.filters = collections, k, mode, filters
        super().__init__(callback_manager=callback_manager)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        found = self._rest.search(
            query_bundle.query_str,
            collections=self.collections,
            mode=self.mode,
            k=self.k,
            filters=self.filters,
        )
        return [
            _scored(hit["chunk_id"], hit["text"], hit_metadata(hit)) for hit in found["results"]
        ]

    def close(self) -> None:
        """Close the client this retriever made (not one it was given)."""
        if self._owned:
            self._rest.close()


def _scored(chunk_id: str, text: str, metadata: dict[str, Any]) -> NodeWithScore:
    hidden = [key for key in metadata if key != "title"]
    node = TextNode(
        id_=chunk_id,
        text=text,
        metadata=metadata,
        excluded_llm_metadata_keys=hidden,
        excluded_embed_metadata_keys=hidden,
    )
    return NodeWithScore(node=node, score=float(metadata["score"]))
