"""The web console: static HTML, CSS and JavaScript modules served by the API at `/ui`.

The page talks to the REST API like any other client (with the key the user types in), so it
needs no routes of its own beyond its files: no build step, nothing but Python to run it.
Every response carries a strict Content-Security-Policy: the console shows text from untrusted
documents and users, and the policy is the second line of defence if a page ever inserted it as
markup (no inline script or style, nothing loaded from elsewhere, no framing).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ragservice.config import ServerSettings

PREFIX = "/ui"
STATIC_DIR = Path(__file__).parent / "static"

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    # Revalidate every time (the ETag makes that a 304): an upgraded server's console is
    # never mixed with modules an earlier version left in the browser's cache.
    (b"cache-control", b"no-cache"),
)


def mount(app: FastAPI, server: ServerSettings) -> None:
    """Serve the console at `/ui/` (and redirect `/ui` there), unless RAGSERVICE_CONSOLE is off."""
    if not server.console:
        return

    @app.get(PREFIX, include_in_schema=False)
    def console_root() -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/", status_code=308)

    app.mount(PREFIX, SecuredFiles(StaticFiles(directory=STATIC_DIR, html=True)), name="console")


class SecuredFiles:
    """An ASGI app that adds the console's security headers to every response of `files`."""

    def __init__(self, files: ASGIApp) -> None:
        self.files = files

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in SECURITY_HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": [*kept, *SECURITY_HEADERS]}
            await send(message)

        await self.files(scope, receive, send_secured)
