"""Per-document readers in the console, in chromium: signed in with a key acting for a user
outside a document's readers, the collection's counts, its document list, the document's page
and the answers (their sources, and what the model was sent) never show the document; with a
key acting for one of its readers they do. An answer cached for a reader is not served to the
outsider."""

from __future__ import annotations

import json
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
from tests.api.conftest import make_key
from tests.api.test_mcp_permissions import COLLECTION, OPEN, QUESTION, RESTRICTED
from tests.browser.conftest import VIEWPORT, Console
from tests.browser.test_console import ask, sign_in
from tests.conftest import as_service_login
from tests.upstream import ok

pytestmark = pytest.mark.slow

HIDDEN = (
    str(RESTRICTED["title"]),
    str(RESTRICTED["external_id"]),
    "ninety thousand",  # of its text, and not of QUESTION (which the prompt holds)
    "before bonuses",
)
INSIDER_ANSWER = "Engineers in band four earn ninety thousand zorkmids [1]."
OUTSIDER_ANSWER = "The documents you may read do not say [1]."


def user_keys(console: Console, data_dir: Path) -> tuple[str, str]:
    """Reader keys of the default tenant acting for ana (in group hr) and bob (not in it)."""

    settings = Settings(
        database_url=as_service_login(console.database_url),
        owner_database_url=console.database_url,
        data_dir=data_dir,
    )
    db = open_database(settings, route_reads=False)
    secrets = []
    try:
        with tenancy.as_system(), db.write() as session:
            tenant_id = store.tenants.ensure_tenant(session, DEFAULT_TENANT_NAME)
            store.tenants.add_group_members(session, tenant_id, "hr", ["ana"])
            for user in ("ana", "bob"):
                secrets.append(make_key(session, tenant_id, "reader", user))
    finally:
        db.dispose()
    return secrets[0], secrets[1]


def add_documents(console: Console) -> None:
    """The collection with the restricted document and an open one, by the admin (no user)."""
    headers = {"Authorization": f"Bearer {console.admin_key}"}
    with httpx.Client(base_url=console.base, headers=headers, timeout=30) as http:
        http.post("/v1/collections", json={"name": COLLECTION}).raise_for_status()
        body = {"documents": [RESTRICTED, OPEN]}
        job = http.post(f"/v1/collections/{COLLECTION}/documents", json=body).json()
        deadline = time.monotonic() + 60
        while http.get(f"/v1/jobs/{job['id']}").json()["status"] not in ("done", "failed"):
            assert time.monotonic() < deadline, "the ingest job did not finish"
            time.sleep(0.2)
        assert http.get(f"/v1/jobs/{job['id']}").json()["status"] == "done"


@pytest.fixture(scope="module")
def keys(console: Console, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    add_documents(console)
    return user_keys(console, tmp_path_factory.mktemp("data"))


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORT)
    try:
        yield context.new_page()
    finally:
        context.close()


def counts(page: Page, console: Console) -> list[str]:
    """The collection's Documents and Chunks cells on the Collections page."""
    page.goto(f"{console.url}#/collections")
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name=COLLECTION))
    expect(row).to_have_count(1)
    return row.get_by_role("cell").all_inner_texts()[2:4]


def shows_none_of_it(page: Page) -> None:
    text = page.locator("main").inner_text()
    assert not any(mark in text for mark in HIDDEN), text


def ask_question(page: Page, console: Console) -> None:
    page.get_by_role("link", name="Ask").click()
    page.get_by_label(COLLECTION).check()
    page.get_by_label("Question").fill(QUESTION)
    ask(page)


def sent_to_the_model(console: Console) -> str:
    """The last chat request the fake upstream received, as JSON text."""
    return json.dumps(console.upstream.chat_requests[-1].body)


def test_a_reader_sees_the_restricted_document(
    console: Console, keys: tuple[str, str], page: Page
) -> None:
    insider, _ = keys
    sign_in(page, console, insider)
    assert counts(page, console) == ["2", "2"]  # documents, chunks
    page.get_by_role("link", name=COLLECTION).click()
    documents = page.get_by_role("table", name=f"Documents of {COLLECTION}")
    expect(documents).to_contain_text(str(RESTRICTED["external_id"]))
    documents.get_by_role("link", name=str(RESTRICTED["external_id"])).click()
    expect(page.get_by_role("heading", name=str(RESTRICTED["title"]), level=1)).to_be_visible()
    expect(page.get_by_text("ninety thousand zorkmids")).to_be_visible()

    console.upstream.enqueue(ok(INSIDER_ANSWER))
    ask_question(page, console)
    expect(page.locator("#cache-outcome")).to_have_text("Cache: miss")
    expect(page.locator("ol.sources")).to_contain_text(str(RESTRICTED["title"]))
    assert "ninety thousand" in sent_to_the_model(console)


def test_an_outsider_never_sees_it(console: Console, keys: tuple[str, str], page: Page) -> None:
    """Runs after the reader's test: the reader's answer is in the cache."""
    _, outsider = keys
    sign_in(page, console, outsider)
    assert counts(page, console) == ["1", "1"]
    shows_none_of_it(page)

    page.get_by_role("link", name=COLLECTION).click()
    table = page.get_by_role("table", name=f"Documents of {COLLECTION}")
    expect(table).to_contain_text(str(OPEN["external_id"]))
    shows_none_of_it(page)

    # Straight to the document's page: the API's "not found", and nothing of it.
    page.goto(f"{console.url}#/collections/{COLLECTION}/documents/{RESTRICTED['external_id']}")
    expect(page.get_by_role("alert")).to_contain_text("not found")
    body = page.locator("main").inner_text()
    assert str(RESTRICTED["title"]) not in body and "ninety thousand" not in body

    asked = len(console.upstream.chat_requests)
    console.upstream.enqueue(ok(OUTSIDER_ANSWER))
    ask_question(page, console)
    expect(page.locator("#cache-outcome")).to_have_text(re.compile("^Cache: miss"))
    assert len(console.upstream.chat_requests) == asked + 1  # the model was asked, not the cache
    assert not any(mark in sent_to_the_model(console) for mark in HIDDEN)
    expect(page.locator("#answer")).to_have_text(OUTSIDER_ANSWER)
    shows_none_of_it(page)
