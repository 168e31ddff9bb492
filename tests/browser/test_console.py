"""The web console at /ui, in chromium: the whole flow of an admin (upload, job, ask with a
streamed answer and citations, feedback stored, a cache hit, purge), a reader's narrower view,
untrusted text shown as text, and a 375 px wide screen without horizontal scrolling."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import psycopg
import pytest
from playwright.sync_api import Browser, BrowserContext, Dialog, Locator, Page, expect

from tests.browser.conftest import PHONE, VIEWPORT, Console
from tests.upstream import ok

pytestmark = pytest.mark.slow

ANSWER = "Centrifugal pumps move water with a spinning impeller [1]."
HOSTILE = "<img src=x onerror=alert(1)>"
PUMPS = b"# Pumps\n\nCentrifugal pumps move water with a spinning impeller and a volute casing."
NOTES = f"# Notes\n\nMaintenance notes: {HOSTILE} check the seals every spring.".encode()
QUESTION = "What moves water in a centrifugal pump?"

# Measures, in the page, the time from the click on Ask to the first token in the answer's DOM.
FIRST_TOKEN_PROBE = """() => {
  delete document.body.dataset.firstTokenMs;
  const answer = document.getElementById("answer");
  const ask = [...document.querySelectorAll("button")].find((b) => b.textContent === "Ask");
  ask.addEventListener("click", () => {
    const started = performance.now();
    const watcher = new MutationObserver(() => {
      if (answer.textContent.length > 0) {
        document.body.dataset.firstTokenMs = String(performance.now() - started);
        watcher.disconnect();
      }
    });
    watcher.observe(answer, { childList: true, characterData: true, subtree: true });
  }, { once: true, capture: true });
}"""

# A drop of files on the upload zone, as a drag from the desktop makes it.
DROP_FILES = """(files) => {
  const transfer = new DataTransfer();
  for (const [name, text] of files) {
    transfer.items.add(new File([text], name, { type: "text/markdown" }));
  }
  return transfer;
}"""


def shoot(page: Page, folders: list[Path], name: str, top: Locator | None = None) -> None:
    """The viewport, scrolled to the top of the page (or of `top`), as `name.png` in each
    folder."""
    if top is None:
        page.evaluate("window.scrollTo(0, 0)")
    else:
        top.evaluate("element => element.scrollIntoView()")
    for folder in folders:
        page.screenshot(path=str(folder / f"{name}.png"))


def sign_in(page: Page, console: Console, key: str) -> None:
    page.goto(console.url)
    expect(page.get_by_role("heading", name="Sign in with an API key")).to_be_visible()
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Use key").click()
    expect(page.get_by_role("navigation", name="Console")).to_be_visible()


def no_alerts(page: Page) -> list[str]:
    """Dialogs the page opened (an injected `alert(1)` would be one); dismissed."""
    opened: list[str] = []

    def dismiss(dialog: Dialog) -> None:
        opened.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismiss)
    return opened


def ask(page: Page) -> float:
    """Ask QUESTION on the Ask page; the milliseconds until the first token was in the DOM."""
    page.evaluate(FIRST_TOKEN_PROBE)
    page.get_by_role("button", name="Ask", exact=True).click()
    body = page.locator("body")
    expect(body).to_have_attribute("data-first-token-ms", re.compile(r"^\d"))
    expect(page.get_by_role("status")).to_contain_text(re.compile("Answer complete|from the cache"))
    return float(body.get_attribute("data-first-token-ms") or "nan")


def test_the_whole_flow(
    console: Console,
    context: BrowserContext,
    screenshots: list[Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    page = context.new_page()
    alerts = no_alerts(page)
    response = httpx.get(console.url)
    assert response.status_code == 200
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(f"{console.base}/ui").headers["location"] == "/ui/"
    sign_in(page, console, console.admin_key)
    expect(page.get_by_role("heading", name="Ask", level=1)).to_be_focused()

    # A collection, and three files dropped on the upload zone: the job runs to done, with a
    # per-file error for the file that is no PDF.
    page.get_by_role("link", name="Collections").click()
    page.get_by_label("Name").fill("manuals")
    page.get_by_role("button", name="Create collection").click()
    page.get_by_role("link", name="manuals").click()
    expect(page.get_by_role("heading", name="Collection manuals")).to_be_focused()
    dropped = page.evaluate_handle(
        DROP_FILES,
        [["pumps.md", PUMPS.decode()], ["notes.md", NOTES.decode()], ["broken.pdf", "no PDF"]],
    )
    page.locator(".dropzone").dispatch_event("drop", {"dataTransfer": dropped})
    expect(page.get_by_role("list", name="Files to upload")).to_contain_text("notes.md")
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text(
        "Ingest job done: 2 new, 1 failed", timeout=60_000
    )
    documents = page.get_by_role("table", name="Documents of manuals")
    expect(documents.get_by_role("link", name="pumps.md")).to_be_visible()
    shoot(page, screenshots, "collection")

    # A document's chunks: the hostile markup is text, and nothing ran.
    documents.get_by_role("link", name="notes.md").click()
    expect(page.get_by_role("heading", name="Notes", level=1)).to_be_visible()
    expect(page.get_by_text(HOSTILE).first).to_be_visible()
    assert page.locator("main img").count() == 0

    page.get_by_role("link", name="Jobs").click()
    jobs = page.get_by_role("table", name="Ingest jobs")
    expect(jobs).to_contain_text("2 new, 1 failed")
    expect(jobs.get_by_role("list", name="Errors")).to_contain_text("broken.pdf: ")
    shoot(page, screenshots, "jobs")

    # Ask: the answer streams in, its citation opens the passage with its document's title.
    page.get_by_role("link", name="Ask").click()
    page.get_by_label("manuals").check()
    page.get_by_label("Question").fill(QUESTION)
    console.upstream.enqueue(ok(ANSWER, chunk_delay=0.05))
    first_token_ms = ask(page)
    with capsys.disabled():
        print(f"\nfirst token in the browser: {first_token_ms:.0f} ms")
    answer = page.locator("#answer")
    expect(answer).to_have_text(re.compile(r"spinning impeller \[1\]\.$"))
    expect(page.locator("#cache-outcome")).to_have_text("Cache: miss")
    page.get_by_role("button", name=re.compile(r"^Source 1: Pumps \(pumps\.md\)")).click()
    source = page.locator("#source-1")
    expect(source.locator("summary")).to_be_focused()
    expect(source.get_by_text("volute casing")).to_be_visible()
    expect(source).to_contain_text("Document: Pumps")
    # Every source is shown as it is stored: the hostile one as text too.
    notes = page.locator("ol.sources > li", has_text="notes.md")
    notes.locator("summary").click()
    expect(notes.get_by_text(HOSTILE)).to_be_visible()
    assert page.locator("img").count() == 0
    shoot(page, screenshots, "ask", top=page.get_by_role("heading", name="Answer"))

    # Thumbs down with a correction, source 1 judged relevant: stored as feedback.
    source.get_by_label("Relevant", exact=True).check()
    page.get_by_label("Thumbs down").check()
    page.get_by_label("Corrected answer").fill("An impeller spins and moves the water [1].")
    page.get_by_role("button", name="Send feedback").click()
    expect(page.get_by_role("status")).to_have_text("Feedback saved. Thank you.")
    with psycopg.connect(console.database_url.replace("+psycopg", "")) as conn:
        rows = conn.execute(
            "SELECT rating, scale, corrected_answer, cardinality(relevant_chunk_ids) FROM feedback"
        ).fetchall()
    assert rows == [(-1, "thumbs", "An impeller spins and moves the water [1].", 1)]

    # The same question again: the cache answers, still streamed.
    ask(page)
    expect(page.locator("#cache-outcome")).to_have_text("Cache: hit (exact)")
    expect(answer).to_have_text(re.compile(r"spinning impeller \[1\]\.$"))

    # Cache: the entry, then a purge (Escape cancels the confirmation; then confirmed).
    page.get_by_role("link", name="Cache").click()
    expect(page.locator("#cache-entries")).to_have_text("1")
    expect(page.get_by_role("table", name=re.compile("Cached answers"))).to_contain_text(QUESTION)
    shoot(page, screenshots, "cache")
    page.get_by_role("button", name="Purge cache").click()
    expect(page.get_by_role("dialog")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.get_by_role("dialog")).to_have_count(0)
    expect(page.locator("#cache-entries")).to_have_text("1")
    page.get_by_role("button", name="Purge cache").click()
    page.get_by_role("dialog").get_by_role("button", name="Purge").click()
    expect(page.get_by_role("status")).to_have_text("Purged 1 cached answer.")
    expect(page.locator("#cache-entries")).to_have_text("0")

    page.get_by_role("link", name="Insights").click()
    expect(page.get_by_role("img", name=re.compile("Questions per day"))).to_be_visible()
    expect(page.get_by_role("table", name="Answers rated down")).to_contain_text(
        "An impeller spins"
    )
    shoot(page, screenshots, "insights")

    # Models: the service admin may roll back, confirmed; the API's refusal is shown.
    page.get_by_role("link", name="Models").click()
    expect(page.get_by_role("table", name="Embedding model versions")).to_contain_text("active")
    shoot(page, screenshots, "models")
    page.get_by_role("button", name="Roll back").click()
    page.get_by_role("dialog").get_by_role("button", name="Roll back").click()
    expect(page.get_by_role("alert")).to_contain_text("nothing to roll back to")
    assert alerts == []


def test_a_reader_a_narrow_screen_and_no_key_prompt_without_auth(
    console: Console, browser: Browser, screenshots: list[Path]
) -> None:
    """Runs after the flow (same module): the collection and its documents exist."""
    reader = browser.new_context(viewport=VIEWPORT)
    try:
        page = reader.new_page()
        sign_in(page, console, console.reader_key)
        nav = page.get_by_role("navigation", name="Console")
        expect(nav.get_by_role("link")).to_have_text(["Ask", "Collections", "Jobs"])
        page.get_by_role("link", name="Collections").click()
        page.get_by_role("link", name="manuals").click()
        expect(page.get_by_role("table", name="Documents of manuals")).to_contain_text("pumps.md")
        expect(page.get_by_role("button", name=re.compile("Delete"))).to_have_count(0)
        expect(page.get_by_role("heading", name="Upload files")).to_have_count(0)
        page.goto(f"{console.url}#/cache")
        expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    finally:
        reader.close()

    phone = browser.new_context(viewport=PHONE)
    try:
        page = phone.new_page()
        sign_in(page, console, console.admin_key)
        for route, heading in [
            ("#/ask", "Ask"),
            ("#/collections/manuals", "Collection manuals"),
            ("#/jobs", "Jobs"),
            ("#/insights", "Insights"),
        ]:
            page.goto(f"{console.url}{route}")
            expect(page.get_by_role("heading", name=heading, level=1)).to_be_visible()
            expect(page.locator("main")).not_to_contain_text("Loading…")
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 375, (route, width)
        page.goto(f"{console.url}#/ask")
        expect(page.get_by_label("manuals")).to_be_visible()
        shoot(page, screenshots, "phone")
    finally:
        phone.close()

    # With authentication off (as `make run` serves), /v1/me says so and no key is asked for.
    open_house = browser.new_context(viewport=VIEWPORT)
    try:
        page = open_house.new_page()
        me = {
            "tenant": {"id": "t", "name": "default"},
            "role": "admin",
            "auth_disabled": True,
            "service_admin": True,
            "key_prefix": None,
            "max_file_bytes": 1,
            "max_files_per_upload": 1,
            "cache_enabled": True,
            "answer_model": "m",
        }
        page.route("**/v1/me", lambda route: route.fulfill(json=me))
        page.goto(console.url)
        expect(page.get_by_role("heading", name="Ask", level=1)).to_be_visible()
        expect(page.get_by_text("default · admin (authentication off)")).to_be_visible()
        expect(page.get_by_label("API key")).to_have_count(0)
    finally:
        open_house.close()
