"""The MCP server: the tools of `tools.py` on an `MCPServer`, run over stdio or streamable HTTP.

Every tool call goes to the REST API through a `RagserviceClient` carrying an API key, so the
key scopes it as it scopes any REST request (tenant, role, rate limit). Over stdio the key is
the one the server was started with; over HTTP each request brings its own
(`Authorization: Bearer <key>`), checked at the door (`door.py`) and forwarded by its tool
calls: agents with different keys can share one server, and each sees only its tenant. The
service's errors become tool errors (`is_error`, the message for the agent to read), not
protocol failures.

This module needs the `mcp` extra; only the `ragservice mcp` command (and tests) import it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Annotated, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field
from starlette.types import ASGIApp

from ragservice.client import Mode, RagserviceClient
from ragservice.errors import RagServiceError, RateLimitedError
from ragservice.mcp_server import tools
from ragservice.mcp_server.door import (
    IDLE_TIMEOUT_SECONDS,
    KEY_TTL_SECONDS,
    Door,
    KeyCheck,
    bearer_token,
)

Connect = Callable[[str | None], AbstractContextManager[RagserviceClient]]
"""A client of the REST API for one tool call, given the request's bearer token (None over
stdio, where the server's own key applies)."""

T = TypeVar("T")

TOOL_K = 5
"""Passages `search` returns unless the assistant asks for another number: few, since each
lands in the assistant's context."""
TOOL_MAX_K = 50
"""The most passages `search` returns."""

INSTRUCTIONS = """\
Search and question answering over the document collections of one ragservice tenant.
Use list_collections to see what there is, search for passages, ask for an answer that cites
its sources as [1], [2]…, and get_document to read a whole document a hit or citation names."""

Collections = Annotated[
    list[str] | None,
    Field(description="collection names to look in; omit to use every collection of yours"),
]


def build_server(connect: Connect) -> MCPServer:
    """The MCP server with the four tools, each calling the REST API through `connect`."""
    server: MCPServer = MCPServer("ragservice", instructions=INSTRUCTIONS)
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    def call(ctx: Context, work: Callable[[RagserviceClient], T]) -> T:
        with _service_errors(), connect(bearer_token(ctx.headers)) as client:
            return work(client)

    @server.tool(annotations=read_only)
    def search(
        query: Annotated[str, Field(min_length=1, description="what to look for")],
        ctx: Context,
        collections: Collections = None,
        k: Annotated[int, Field(ge=1, le=TOOL_MAX_K, description="how many passages")] = TOOL_K,
        mode: Annotated[
            Mode,
            Field(
                description="hybrid (default): meaning and words; dense: meaning; fulltext: words"
            ),
        ] = "hybrid",
    ) -> tools.SearchResult:
        """Find the passages of the collections that best match a query, best first, each
        with its document's title and id, its score and (for a PDF) its pages."""
        return call(ctx, lambda client: tools.search(client, query, collections, k, mode))

    @server.tool(annotations=read_only)
    def ask(
        question: Annotated[str, Field(min_length=1, description="the question to answer")],
        ctx: Context,
        collections: Collections = None,
    ) -> tools.AnswerResult:
        """Answer a question from the collections. The answer cites its sources as [1], [2]…;
        `citations` names each: title, how to cite it (pages included) and the document id
        (read it with get_document and the collection it came from)."""
        return call(ctx, lambda client: tools.ask(client, question, collections))

    @server.tool(annotations=read_only)
    def list_collections(ctx: Context) -> tools.CollectionList:
        """The collections you can search: name, description and number of documents."""
        return call(ctx, tools.list_collections)

    @server.tool(annotations=read_only)
    def get_document(
        collection: Annotated[str, Field(min_length=1, description="the document's collection")],
        document_id: Annotated[
            str, Field(min_length=1, description="the document id a hit or citation gives")
        ],
        ctx: Context,
    ) -> tools.DocumentText:
        """One whole document: title, metadata and text."""
        return call(ctx, lambda client: tools.get_document(client, collection, document_id))

    return server


def fixed_client(client: RagserviceClient) -> Connect:
    """Every tool call on `client` (stdio: one key, the one it was made with)."""

    @contextmanager
    def connect(_token: str | None) -> Iterator[RagserviceClient]:
        yield client

    return connect


def client_per_key(url: str, timeout: float = 120.0) -> Connect:
    """Each tool call on a client of `url` sending the request's own key (HTTP)."""

    @contextmanager
    def connect(token: str | None) -> Iterator[RagserviceClient]:
        with RagserviceClient.connect(url, api_key=token, timeout=timeout) as client:
            yield client

    return connect


def key_check(connect: Connect, *, ttl: float = KEY_TTL_SECONDS) -> KeyCheck:
    """The door's key check, asking the REST API through `connect` (`GET /v1/me`)."""

    def verify(token: str) -> None:
        with connect(token) as client:
            client.me()

    return KeyCheck(verify, ttl=ttl)


def http_app(
    server: MCPServer,
    *,
    host: str,
    check: KeyCheck,
    idle_timeout: float = IDLE_TIMEOUT_SECONDS,
) -> ASGIApp:
    """The streamable HTTP app at `/mcp` (stateless: each request stands alone, with its key)
    behind the door (`door.py`): a request without a live key is answered 401 before it
    reaches the server, and an idle GET stream is ended after `idle_timeout` seconds."""
    app = server.streamable_http_app(stateless_http=True, host=host)
    return Door(app, check=check, idle_timeout=idle_timeout)


@contextmanager
def _service_errors() -> Iterator[None]:
    """The service's errors as tool errors: the agent reads the message and what kind it is."""
    try:
        yield
    except RateLimitedError as exc:
        raise ToolError(f"RateLimited: {exc} (retry after {exc.retry_after:g} s)") from exc
    except RagServiceError as exc:
        kind = type(exc).__name__.removesuffix("Error")
        raise ToolError(f"{kind}: {exc}") from exc
