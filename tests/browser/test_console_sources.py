"""A collection's sources in the console, in chromium: a folder source (made through the
services, as `ragservice sources add` makes one) run once by the workers is listed with its
schedule and last run, its failed document folded under its errors; Run now queues a run,
which the page follows until it is done and then shows as the last run. A web source the
guard refuses (a loopback address) is not added, and the page says why."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from ragservice import store
from ragservice.config import DEFAULT_TENANT_NAME, Settings
from ragservice.db import open_database, tenancy
from ragservice.services import sources
from ragservice.services.callers import Operator
from tests.browser.conftest import VIEWPORT, Console
from tests.browser.test_console import no_alerts, shoot, sign_in
from tests.conftest import as_service_login

pytestmark = pytest.mark.slow

COLLECTION = "handbook"


def add_folder_source(console: Console, folder: Path, data_dir: Path) -> str:
    """The collection, and a folder source of it with an hourly schedule; the source's id."""
    headers = {"Authorization": f"Bearer {console.admin_key}"}
    with httpx.Client(base_url=console.base, headers=headers, timeout=30) as http:
        http.post("/v1/collections", json={"name": COLLECTION}).raise_for_status()
    settings = Settings(
        database_url=as_service_login(console.database_url),
        owner_database_url=console.database_url,
        data_dir=data_dir,
    )
    db = open_database(settings, route_reads=False)
    try:
        with tenancy.as_system(), db.read() as session:
            tenant_id = store.tenants.find_tenant_id(session, DEFAULT_TENANT_NAME)
        assert tenant_id is not None
        spec = sources.SourceSpec(location=str(folder), options={}, every_seconds=3600)
        operator = Operator(tenant_id=tenant_id, actor="cli:test")
        with tenancy.as_tenant(tenant_id):
            added = sources.add_source(db, settings, operator, COLLECTION, spec, operator=True)
    finally:
        db.dispose()
    return str(added.id)


def run_and_wait(console: Console, source_id: str) -> None:
    """Run the source through the API and wait until a worker has run it."""
    headers = {"Authorization": f"Bearer {console.admin_key}"}
    path = f"/v1/collections/{COLLECTION}/sources/{source_id}"
    with httpx.Client(base_url=console.base, headers=headers, timeout=30) as http:
        http.post(f"{path}/run").raise_for_status()
        deadline = time.monotonic() + 60
        while True:
            run = http.get(path).json().get("last_run") or {}
            if run.get("status") in ("done", "failed"):
                break
            assert time.monotonic() < deadline, "the source's run did not end"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def source(console: Console, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("handbook")
    (folder / "leave.md").write_text("# Leave\n\nParents get sixteen weeks of paid leave.")
    (folder / "travel.md").write_text("# Travel\n\nBook flights early.")
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 not really a pdf")
    source_id = add_folder_source(console, folder, tmp_path_factory.mktemp("data"))
    run_and_wait(console, source_id)
    yield source_id


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORT)
    try:
        yield context.new_page()
    finally:
        context.close()


def test_the_sources_page_lists_the_last_run_and_runs_one_now(
    page: Page, console: Console, source: str, screenshots: list[Path]
) -> None:
    opened = no_alerts(page)
    sign_in(page, console, console.admin_key)
    page.goto(f"{console.url}#/collections/{COLLECTION}")
    page.get_by_role("link", name="Sources").click()
    expect(page.get_by_role("heading", name=f"Sources of {COLLECTION}")).to_be_visible()

    row = page.get_by_role("row").filter(has=page.get_by_text("(folder)"))
    expect(row).to_have_count(1)
    expect(row).to_contain_text("every 1 h")
    expect(row.locator(".badge")).to_have_text(re.compile("done|failed"))
    expect(row).to_contain_text("2 added")
    errors = row.locator("details")
    expect(errors.locator("summary")).to_have_text("1 error")
    expect(errors.get_by_text("broken.pdf")).to_be_hidden()  # folded until opened
    errors.locator("summary").click()
    expect(errors.get_by_text(re.compile("broken.pdf"))).to_be_visible()

    row.get_by_role("button", name=re.compile("Run .* now")).click()
    run = page.locator(".source-run")
    expect(run).to_contain_text("Job ")
    expect(run.locator(".badge")).to_have_text(re.compile("done|failed"), timeout=60_000)
    expect(run).to_contain_text("2 unchanged")
    expect(row).to_contain_text("2 unchanged")  # the new run is the last run now
    expect(page.get_by_role("status")).to_contain_text("Run of")
    shoot(page, screenshots, "sources")

    form = page.locator("form").filter(has=page.get_by_role("heading", name="Add a source"))
    form.get_by_label("Location").fill("http://127.0.0.1:9/")  # the guard refuses loopback
    form.get_by_label("Crawl depth").fill("1")
    form.get_by_role("button", name="Add source").click()
    expect(page.get_by_role("alert")).to_contain_text("127.0.0.1")
    expect(page.get_by_role("row").filter(has=page.get_by_text("(web)"))).to_have_count(0)
    assert opened == []
