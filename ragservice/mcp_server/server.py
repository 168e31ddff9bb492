"""The MCP server: the tools of `tools.py` on an `MCPServer`, run over stdio or streamable HTTP.

Every tool call goes to the REST API through a `RagserviceClient` carrying an API key, so the
key scopes it as it scopes any REST request (tenant, role, rate limit). Over stdio the key is
the one the server was started with; over HTTP each request brings its own
(`Authorization: Bearer <key>`), which its tool calls forward: agents with different keys can
share one server, and each sees only its tenant. The service's errors become tool errors
(`is_error`, the message for the agent to read), not protocol failures.

This module needs the `mcp` extra; only the `ragservice mcp` command (and tests) import it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ragservice.client import Mode, RagserviceClient
from ragservice.errors import RagServiceError, RateLimitedError
from ragservice.mcp_server import tools

Connect = Callable[[str | None], AbstractContextManager[RagserviceClient]]
"""A client of the REST API for one tool call, given the request's bearer token (None over
stdio, where the server's own key applies)."""

T = TypeVar("T")

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
        k: Annotated[int, Field(ge=1, le=50, description="how many passages")] = 5,
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


def bearer_token(headers: Any) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, if the headers have one."""
    if headers is None:
        return None
    scheme, _, token = str(headers.get("authorization") or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def http_app(server: MCPServer, *, host: str) -> ASGIApp:
    """The streamable HTTP app at `/mcp` (stateless: each request stands alone, with its key);
    a request without a bearer token is answered 401 before it reaches the server."""
    app = server.streamable_http_app(stateless_http=True, host=host)
    return RequireBearer(app)


class RequireBearer:
    """ASGI middleware: 401 for an HTTP request without `Authorization: Bearer <token>`. The
    token itself is checked by the REST API, on each tool call that forwards it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and bearer_token(Headers(scope=scope)) is None:
            refusal = JSONResponse(
                {"error": "Authentication", "detail": "send your API key as a bearer token"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)


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
