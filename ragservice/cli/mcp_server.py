"""`ragservice mcp`: the MCP server for agents, over stdio (one key) or streamable HTTP (each
request's own key), calling the REST API of a running `ragservice serve`."""

from __future__ import annotations

import enum
from typing import Annotated

import typer

from ragservice.cli.common import ApiKeyOption, console, fail
from ragservice.extras import missing_extra


class Transport(enum.StrEnum):
    STDIO = "stdio"
    HTTP = "http"


def mcp(
    transport: Annotated[
        Transport,
        typer.Option(
            "--transport",
            help="stdio: for an agent that starts this command; http: streamable HTTP at "
            "http://HOST:PORT/mcp, each request sending its API key as a bearer token.",
        ),
    ] = Transport.STDIO,
    url: Annotated[
        str,
        typer.Option(
            "--url", envvar="RAGSERVICE_URL", show_envvar=True, help="The REST API to call."
        ),
    ] = "http://127.0.0.1:8000",
    api_key: ApiKeyOption = None,
    host: Annotated[
        str, typer.Option("--host", help="http: the address to listen on.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="http: the port.")] = 8001,
    idle_timeout: Annotated[
        float,
        typer.Option(
            "--idle-timeout",
            envvar="RAGSERVICE_MCP_IDLE_TIMEOUT",
            show_envvar=True,
            min=0.1,
            help="http: seconds a GET event stream may carry no message before it is ended.",
        ),
    ] = 60.0,
    key_cache_seconds: Annotated[
        float,
        typer.Option(
            "--key-cache-seconds",
            envvar="RAGSERVICE_MCP_KEY_CACHE_SECONDS",
            show_envvar=True,
            min=0,
            help="http: how long a key the REST API accepted is trusted before it is asked "
            "again (a revoked key is refused within this time).",
        ),
    ] = 5.0,
) -> None:
    """Serve search, ask, list_collections and get_document as MCP tools.

    Every tool call is a request to the REST API at --url with an API key, which decides the
    tenant, the role and the rate limit as for any REST call: over stdio the --api-key, over
    http the key each MCP request carries (`Authorization: Bearer <key>`), checked with the REST
    API before the request is read (none, or one it refuses: 401)."""
    if (missing := missing_extra("mcp", "ragservice mcp")) is not None:
        raise fail(missing)
    import uvicorn

    from ragservice.client import RagserviceClient
    from ragservice.mcp_server.server import (
        build_server,
        client_per_key,
        fixed_client,
        http_app,
        key_check,
    )

    if transport is Transport.STDIO:
        with RagserviceClient.connect(url, api_key=api_key, timeout=120.0) as client:
            build_server(fixed_client(client)).run("stdio")
        return
    if api_key:
        console.print("--api-key is not used over http: each request sends its own key")
    connect = client_per_key(url)
    check = key_check(client_per_key(url, timeout=10.0), ttl=key_cache_seconds)
    app = http_app(build_server(connect), host=host, check=check, idle_timeout=idle_timeout)
    console.print(f"MCP server at http://{host}:{port}/mcp, calling {url}")
    uvicorn.run(app, host=host, port=port, log_level="warning")
