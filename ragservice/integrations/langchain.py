"""A LangChain retriever over ragservice's search API (needs the `langchain` extra).

```python
from ragservice.integrations.langchain import RagserviceRetriever

retriever = RagserviceRetriever(
    url="http://127.0.0.1:8000", api_key="rsk_...", collections=["handbook"], k=4
)
for doc in retriever.invoke("How long is parental leave?"):
    print(doc.metadata["title"], doc.metadata["score"], doc.page_content)
```

Each hit becomes a `Document`: the chunk's text, and metadata naming the document
(`document_id`, `title`, `collection`), the chunk (`chunk_id`, `start_char`, `end_char`,
`pages` of a PDF) and its `score`. The API key scopes the search as any REST call. Async use
(`ainvoke`) runs the search on LangChain's executor."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, PrivateAttr, SecretStr

from ragservice.client import Mode, RagserviceClient
from ragservice.integrations.hits import RETRIEVER_K, hit_metadata, open_client, require

try:
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:
    raise require("langchain", "ragservice.integrations.langchain", exc) from exc


class RagserviceRetriever(BaseRetriever):
    """The `k` best chunks of `collections` (unset: all the key's tenant has) for a query."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    url: str | None = Field(default=None, description="the server, e.g. http://127.0.0.1:8000")
    api_key: SecretStr | None = None
    client: RagserviceClient | None = Field(
        default=None, exclude=True, description="a client to use instead of url and api_key"
    )
    collections: list[str] | None = None
    k: int = Field(default=RETRIEVER_K, ge=1)
    mode: Mode = "hybrid"
    filters: dict[str, Any] | None = Field(
        default=None, description="metadata filters, as `POST /v1/search` takes them"
    )
    timeout: float = 60.0

    _client: RagserviceClient | None = PrivateAttr(default=None)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        found = self._rest().search(
            query, collections=self.collections, mode=self.mode, k=self.k, filters=self.filters
        )
        return [
            Document(page_content=hit["text"], metadata=hit_metadata(hit), id=hit["chunk_id"])
            for hit in found["results"]
        ]

    def close(self) -> None:
        """Close the client this retriever made (not one it was given)."""
        if self._client is not None and self._client is not self.client:
            self._client.close()
        self._client = None

    def _rest(self) -> RagserviceClient:
        if self._client is None:
            key = self.api_key.get_secret_value() if self.api_key else None
            self._client = open_client(self.url, key, self.client, self.timeout)
        return self._client
