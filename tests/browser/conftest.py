"""The console in a real browser: Debian's chromium, driven by Playwright, against a real
`ragservice serve` process (authentication on, the prompt cache on, a fake OpenAI upstream that
streams its answer word by word).

One server, one browser and one database serve the whole module: starting them is most of the
cost. Without a chromium (RAGSERVICE_BROWSER, else /usr/bin/chromium) the tests are skipped,
unless RAGSERVICE_REQUIRE_BROWSER=1 (`make test`), which makes that a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, ViewportSize, sync_playwright

from ragservice import store
from ragservice.auth.keys import new_key
from ragservice.config import DEFAULT_TENANT_NAME, Settings
from ragservice.db import open_database, tenancy
from tests.conftest import as_service_login, fresh_database
from tests.e2e.test_server import BIN, free_port, wait_until_ready
from tests.upstream import FakeOpenAI

VIEWPORT: ViewportSize = {"width": 1280, "height": 800}
PHONE: ViewportSize = {"width": 375, "height": 740}


def browser_executable() -> str:
    """The chromium to drive; skips (or fails, under RAGSERVICE_REQUIRE_BROWSER=1) without one."""
    configured = os.environ.get("RAGSERVICE_BROWSER")
    candidates = [configured] if configured else ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
    for candidate in candidates:
        found = shutil.which(candidate)
        if found:
            return found
    reason = (
        f"no chromium at {configured!r} (RAGSERVICE_BROWSER)"
        if configured
        else "no chromium at /usr/bin/chromium: install Debian's chromium or set RAGSERVICE_BROWSER"
    )
    if os.environ.get("RAGSERVICE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason} (RAGSERVICE_REQUIRE_BROWSER=1)", pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class Console:
    """The running server: its base URL, its owner database URL (to check what was stored),
    an admin and a reader key of the default tenant (whose admin is the service admin, who may
    switch models), and the fake upstream (to script answers)."""

    base: str
    database_url: str
    admin_key: str
    reader_key: str
    upstream: FakeOpenAI

    @property
    def url(self) -> str:
        return f"{self.base}/ui/"


def make_keys(database_url: str, data_dir: Path) -> tuple[str, str]:
    """An admin and a reader key of the default tenant, written straight to the store."""
    settings = Settings(
        database_url=as_service_login(database_url),
        owner_database_url=database_url,
        data_dir=data_dir,
    )
    db = open_database(settings, route_reads=False)
    secrets = []
    try:
        with tenancy.as_system(), db.write() as session:
            tenant_id = store.tenants.ensure_tenant(session, DEFAULT_TENANT_NAME)
            for role in ("admin", "reader"):
                key = new_key()
                store.tenants.create_api_key(
                    session, tenant_id=tenant_id, role=role, prefix=key.prefix, key_hash=key.hash
                )
                secrets.append(key.secret)
    finally:
        db.dispose()
    return secrets[0], secrets[1]


@pytest.fixture(scope="module")
def chromium() -> str:
    return browser_executable()


@pytest.fixture(scope="module")
def console(chromium: str, pg_admin_url: str, template_url: str) -> Iterator[Console]:
    workdir = Path(tempfile.mkdtemp(prefix="ragservice-console-"))
    log_path = workdir / "server.log"
    with fresh_database(pg_admin_url) as database_url, FakeOpenAI() as upstream:
        admin_key, reader_key = make_keys(database_url, workdir / "data")
        env = {
            **os.environ,
            "RAGSERVICE_DATABASE_URL": as_service_login(database_url),
            "RAGSERVICE_OWNER_DATABASE_URL": database_url,
            "RAGSERVICE_DATA_DIR": str(workdir / "data"),
            "RAGSERVICE_JOB_POLL_SECONDS": "0.2",
            "RAGSERVICE_INFERENCE_URL": upstream.base_url,
            "RAGSERVICE_INFERENCE_MODEL": "fake-model",
            "RAGSERVICE_CACHE_ENABLED": "true",
            "RAGSERVICE_RATE_LIMIT_PER_SECOND": "0",  # the console polls jobs
            "RAGSERVICE_AUTH_DISABLED": "false",
            "HF_HUB_OFFLINE": "1",
        }
        port = free_port()
        with log_path.open("w") as log:
            process = subprocess.Popen(
                [str(BIN / "ragservice"), "serve", "--port", str(port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until_ready(base, process)
            yield Console(base, database_url, admin_key, reader_key, upstream)
        except AssertionError:
            raise AssertionError(f"server failed; its log:\n{log_path.read_text()}") from None
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Where each page's screenshot goes: pytest's temporary folder, and
    RAGSERVICE_SCREENSHOTS_DIR when set (`docs/console` keeps the documented ones)."""
    folders = [tmp_path_factory.mktemp("console-screenshots")]
    extra = os.environ.get("RAGSERVICE_SCREENSHOTS_DIR")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        folders.append(Path(extra))
    return folders


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    """A fresh browser context (no cookies, no storage) at the desktop viewport."""
    opened = browser.new_context(viewport=VIEWPORT)
    try:
        yield opened
    finally:
        opened.close()
