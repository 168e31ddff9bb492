"""A typed client of the REST API, on httpx: search, answers (streamed), collections,
documents (JSON texts and file uploads), ingest jobs, feedback, and the admin reads.

```python
with RagserviceClient.connect("http://127.0.0.1:8000", api_key="rsk_...") as client:
    job = client.upload_files("handbook", ["leave.pdf", "faq.md"])
    client.wait_job(job["id"])
    hits = client.search("impeller pumps", k=5)["results"]
    for event in client.ask("How do pumps move water?"):
        if isinstance(event, Token):
            print(event.text, end="")
```

`RagserviceClient.from_env()` reads the server and key from `RAGSERVICE_URL` and
`RAGSERVICE_API_KEY`. Responses are the API's JSON documents, typed below (`docs/api.md`
describes each field; `NotRequired` ones are absent from the answers of older servers).
An error response raises the service's own exception for it (`ragservice.errors`: 404
`NotFoundError`, 409 `ConflictError`, 429 `RateLimitedError`, ...) with the server's `detail`
as its message; a server that cannot be reached raises `ServiceUnreachableError`.
"""

from ragservice.client.core import RagserviceClient
from ragservice.client.types import (
    API_KEY_VARIABLE,
    DEFAULT_URL,
    KEEP,
    URL_VARIABLE,
    AskEvent,
    AuditEntry,
    AuditPage,
    CacheStats,
    Chunk,
    Citation,
    Citations,
    Collection,
    Document,
    DocumentDetail,
    DocumentIn,
    DocumentPage,
    DocumentRef,
    Done,
    ExportFormat,
    Feedback,
    FlaggedChunks,
    Health,
    Job,
    JobError,
    JobStatus,
    Me,
    Mode,
    QueryResponse,
    Scale,
    SearchHit,
    SearchResponse,
    Source,
    Token,
    Upload,
)

__all__ = [
    "API_KEY_VARIABLE",
    "DEFAULT_URL",
    "KEEP",
    "URL_VARIABLE",
    "AskEvent",
    "AuditEntry",
    "AuditPage",
    "CacheStats",
    "Chunk",
    "Citation",
    "Citations",
    "Collection",
    "Document",
    "DocumentDetail",
    "DocumentIn",
    "DocumentPage",
    "DocumentRef",
    "Done",
    "ExportFormat",
    "Feedback",
    "FlaggedChunks",
    "Health",
    "Job",
    "JobError",
    "JobStatus",
    "Me",
    "Mode",
    "QueryResponse",
    "RagserviceClient",
    "Scale",
    "SearchHit",
    "SearchResponse",
    "Source",
    "Token",
    "Upload",
]
