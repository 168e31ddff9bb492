"""The console's files as the API serves them, without a browser (tests/browser drives one):
security headers, the redirect, the switch that turns it off, and no markup built from strings
or inline script and style that the Content-Security-Policy would have to allow."""

from __future__ import annotations

import re

from fastapi import FastAPI
from fastapi.testclient import TestClient

from ragservice import console
from ragservice.config import Settings


def test_the_console_is_served_with_a_strict_policy_and_builds_no_markup() -> None:
    app = FastAPI()
    console.mount(app, Settings(console=True).server)
    with TestClient(app) as client:
        assert client.get("/ui", follow_redirects=False).headers["location"] == "/ui/"
        page = client.get("/ui/")
        module = client.get("/ui/js/main.js")
        missing = client.get("/ui/js/nothing.js")
    assert page.status_code == module.status_code == 200
    assert missing.status_code == 404
    assert page.headers["content-security-policy"] == console.CONTENT_SECURITY_POLICY
    assert "script-src 'self';" in console.CONTENT_SECURITY_POLICY
    assert (page.headers["x-content-type-options"], page.headers["referrer-policy"]) == (
        "nosniff",
        "no-referrer",
    )
    assert module.headers["content-type"].startswith("text/javascript")  # modules need it
    assert module.headers["content-security-policy"] == console.CONTENT_SECURITY_POLICY

    off = FastAPI()
    console.mount(off, Settings(console=False).server)
    with TestClient(off) as client:
        assert client.get("/ui/").status_code == 404

    sources = {
        path.relative_to(console.STATIC_DIR).as_posix(): path.read_text()
        for path in console.STATIC_DIR.rglob("*")
        if path.suffix in (".html", ".js")
    }
    assert {
        "index.html",
        "js/main.js",
        "js/api.js",
        "js/pages/ask.js",
        "js/pages/sources.js",
    } <= set(sources)
    for name, text in sources.items():
        code = re.sub(r"//.*", "", text)  # comments may name what is not done
        assert not re.search(
            r"\.(innerHTML|outerHTML)\b|insertAdjacentHTML|document\.write", code
        ), name
        assert not re.search(r"\bstyle\s*=|<style|\bon[a-z]+\s*=\s*\"|eval\(|new Function", code), (
            name
        )
        assert not re.search(r"<script(?![^>]*\bsrc=)", code), name  # no inline script
        for imported in re.findall(r'from "(\.[^"]+)"', code):  # every module import resolves
            target = (console.STATIC_DIR / name).parent / imported
            assert target.resolve().is_file(), (name, imported)
