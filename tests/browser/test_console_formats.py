"""The console takes every format the loaders read, as `GET /v1/formats` lists them: a deck
and a workbook chosen in the upload form are ingested, each document citing its slides or
sheets."""

from __future__ import annotations

import pytest
from playwright.sync_api import BrowserContext, expect

from ingest.loaders.formats import SUPPORTED_SUFFIXES
from tests.browser.conftest import Console
from tests.browser.test_console import no_alerts, sign_in
from tests.corpus_office import make_deck, make_workbook

pytestmark = pytest.mark.slow

PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def test_a_deck_and_a_workbook_are_uploaded_and_ingested(
    console: Console, context: BrowserContext
) -> None:
    page = context.new_page()
    alerts = no_alerts(page)
    sign_in(page, console, console.admin_key)
    page.get_by_role("link", name="Collections").click()
    page.get_by_label("Name").fill("office")
    page.get_by_role("button", name="Create collection").click()
    page.get_by_role("link", name="office").click()
    expect(page.get_by_role("heading", name="Collection office")).to_be_focused()

    # The form offers what the server reads, as the server lists it.
    chooser = page.locator("#upload-files")
    expect(chooser).to_have_attribute("accept", ",".join(SUPPORTED_SUFFIXES))
    expect(page.locator(".dropzone .hint")).to_contain_text(".pptx .xlsx")

    chooser.set_input_files(
        [
            {"name": "review.pptx", "mimeType": PPTX, "buffer": make_deck()},
            {"name": "results.xlsx", "mimeType": XLSX, "buffer": make_workbook()},
        ]
    )
    files = page.get_by_role("list", name="Files to upload")
    expect(files).to_contain_text("review.pptx")
    expect(files).to_contain_text("results.xlsx")
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text("Ingest job done: 2 new", timeout=60_000)

    documents = page.get_by_role("table", name="Documents of office")
    expect(documents.get_by_role("link", name="results.xlsx")).to_be_visible()
    documents.get_by_role("link", name="review.pptx").click()
    expect(page.get_by_text("Revenue grew 12%").first).to_be_visible()
    assert alerts == []
