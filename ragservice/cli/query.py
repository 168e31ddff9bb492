"""`ragservice search` and `ragservice ask`: retrieval and answers from the terminal, in this
process on the local store (the settings every command uses) or from a server (`--url`).

Both modes give the API's JSON documents (`--json`), so a script sees the same fields either
way; `ask` prints the answer as it is generated, then its citations.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from ragservice.cli.choices import Mode
from ragservice.cli.common import (
    ApiKeyOption,
    UrlOption,
    console,
    exit_on_error,
    local_tenant,
    remote_client,
)
from ragservice.config import get_settings
from ragservice.limits.results import ANSWER_K, SEARCH_K

if TYPE_CHECKING:
    from ragservice.client import AskEvent, Citation, QueryResponse
    from ragservice.runtime import Runtime
    from ragservice.services.answers import AskQuery

CollectionsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--collection", "-c", help="A collection to search (repeatable; default: every one)."
    ),
]
ModeOption = Annotated[Mode, typer.Option("--mode", help="dense, fulltext or hybrid.")]
TenantOption = Annotated[
    str | None,
    typer.Option(
        "--tenant",
        help="Without --url: the tenant (by name) whose collections are searched (default: "
        "default). With --url the API key decides.",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's JSON response instead.")]


def search(
    query: Annotated[str, typer.Argument(help="What to search for.")],
    collections: CollectionsOption = None,
    k: Annotated[int, typer.Option("-k", min=1, help="Results to return.")] = SEARCH_K,
    mode: ModeOption = Mode.HYBRID,
    tenant: TenantOption = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Search the chunks of the collections, best first: score, document, text."""
    with exit_on_error():
        if url is not None:
            with remote_client(url, api_key, tenant) as client:
                found: dict[str, Any] = dict(
                    client.search(query, collections=collections, mode=mode.value, k=k)
                )
        else:
            found = _search_locally(query, collections, mode, k, local_tenant(tenant))
    if as_json:
        typer.echo(json.dumps(found, indent=2, ensure_ascii=False))
        return
    _print_hits(found["results"])


def ask(
    question: Annotated[str, typer.Argument(help="The question.")],
    collections: CollectionsOption = None,
    k: Annotated[int, typer.Option("-k", min=1, help="Chunks retrieved as context.")] = ANSWER_K,
    mode: ModeOption = Mode.HYBRID,
    tenant: TenantOption = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the API's whole JSON response at the end.")
    ] = False,
) -> None:
    """Answer a question from the collections: the answer as it is generated, then the sources
    it cites, numbered as in the answer ([1], [2]...). Without RAGSERVICE_INFERENCE_URL the
    answer is extractive (the best passages)."""
    show = _Answer(as_json=as_json)
    with exit_on_error(), _stopped_by_ctrl_c():
        if url is not None:
            with remote_client(url, api_key, tenant) as client:
                for event in client.ask(question, collections=collections, mode=mode.value, k=k):
                    show(event)
        else:
            _ask_locally(question, collections, mode, k, local_tenant(tenant), show)


@contextmanager
def _stopped_by_ctrl_c() -> Iterator[None]:
    """Ctrl-C while an answer streams ends the command quietly, with the shell's status 130."""
    try:
        yield
    except KeyboardInterrupt:
        typer.echo("")
        raise typer.Exit(130) from None


# -- local mode ----------------------------------------------------------------------------


@contextmanager
def _local_runtime(tenant: str) -> Iterator[tuple[Runtime, Any]]:
    """The runtime (the model loaded) and the tenant's id, its transactions the tenant's."""
    from ragservice.db import tenancy
    from ragservice.runtime import open_runtime
    from ragservice.services import tenants

    with console.status("loading the model"):
        runtime = open_runtime(get_settings())
    try:
        tenant_id = tenants.tenant_id_of(runtime.db, tenant)
        with tenancy.as_tenant(tenant_id):
            yield runtime, tenant_id
    finally:
        runtime.close()


def _search_locally(
    query: str, collections: list[str] | None, mode: Mode, k: int, tenant: str
) -> dict[str, Any]:
    from ragservice.retrieval import options
    from ragservice.services.composition import search_service
    from ragservice.services.search import SearchQuery
    from ragservice.services.views import found_out

    asked = SearchQuery(text=query, collections=collections, mode=options.Mode(mode), k=k)
    with _local_runtime(tenant) as (runtime, tenant_id), search_service(runtime) as service:
        found = service.search(tenant_id, asked)
    return found_out(found).model_dump(mode="json")


def _ask_locally(
    question: str,
    collections: list[str] | None,
    mode: Mode,
    k: int,
    tenant: str,
    show: Callable[[AskEvent], None],
) -> None:
    import asyncio

    from ragservice.retrieval import options
    from ragservice.services.answers import AskQuery
    from ragservice.services.search import SearchQuery

    search = SearchQuery(text=question, collections=collections, mode=options.Mode(mode), k=k)
    asked = AskQuery(search=search)
    with _local_runtime(tenant) as (runtime, tenant_id):
        # The task inherits this thread's tenancy, and the pipeline's threads the task's.
        asyncio.run(_stream_answer(runtime, tenant_id, asked, show))


async def _stream_answer(
    runtime: Runtime, tenant_id: uuid.UUID, asked: AskQuery, show: Callable[[AskEvent], None]
) -> None:
    """The answering service the server runs, its pieces and answer shown as the API's
    events."""
    from ragservice.answering.answer import Answer
    from ragservice.answering.inference import InferenceClient
    from ragservice.client import Citations, Done, Token
    from ragservice.db import tenancy
    from ragservice.metrics import Metrics
    from ragservice.services.composition import query_services
    from ragservice.services.views import answer_out

    inference = InferenceClient.from_settings(runtime.settings, owner=tenancy.current_tenant_id)
    try:
        with query_services(runtime, inference=inference, metrics=Metrics()) as services:
            answers = services.answers
            answers.check(asked, field="question")
            async for item in await answers.stream(tenant_id, asked):
                if not isinstance(item, Answer):
                    show(Token(item))
                    continue
                whole = answer_out(item).model_dump(mode="json")
                show(Citations(whole["citations"], whole["sources"]))
                show(Done(cast("QueryResponse", whole)))  # the same JSON document
    finally:
        if inference is not None:
            await inference.aclose()


# -- output ----------------------------------------------------------------------------------


class _Answer:
    """Shows an answer's events: its pieces on stdout as they come, then the citations; or,
    with `as_json`, the whole response once it is there."""

    def __init__(self, *, as_json: bool) -> None:
        self._as_json = as_json

    def __call__(self, event: AskEvent) -> None:
        from ragservice.client import Done, Token

        if isinstance(event, Token) and not self._as_json:
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif isinstance(event, Done):
            self._done(dict(event.response))

    def _done(self, response: dict[str, Any]) -> None:
        if self._as_json:
            typer.echo(json.dumps(response, indent=2, ensure_ascii=False))
            return
        typer.echo("")
        if response["citations"]:
            typer.echo("")
        for citation in response["citations"]:
            typer.echo(f"[{citation['number']}] {cited_as(citation)}")
        if response["status"] == "extractive":
            console.print("(extractive: the best passages, not a generated answer)")
        elif response["status"] != "ok":
            console.print(f"(answer status: {response['status']})")


def cited_as(citation: Citation) -> str:
    """How a source is named for a reader: `Title (report.pdf, p. 12)`, or `report.pdf, p. 12`
    without a title; as the server names it when it does."""
    if "cited_as" in citation:
        return citation["cited_as"]
    document = citation["document"]
    where = ", ".join(
        part for part in (document["external_id"], page_label(citation.get("pages"))) if part
    )
    return f"{document['title']} ({where})" if document["title"] else where


def page_label(pages: list[int] | None) -> str:
    """`p. 12`, `pp. 12-13` (an en dash), or nothing for a document without pages."""
    if not pages:
        return ""
    first, last = min(pages), max(pages)
    return f"p. {first}" if first == last else f"pp. {first}\u2013{last}"


def _print_hits(hits: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    if not hits:
        console.print("no results")
        return
    table = Table(show_lines=True)
    for column in ("#", "score", "source", "text"):
        table.add_column(column, overflow="fold")
    for number, hit in enumerate(hits, 1):
        document = hit["document"]
        source = ", ".join(
            part for part in (document["external_id"], page_label(hit.get("pages"))) if part
        )
        if document.get("title"):
            source = f"{document['title']}\n{source}"
        text = " ".join(hit["text"].split())
        # Text, not markup: brackets in a document are shown as they are.
        cells = (str(number), f"{hit['score']:.4f}", f"{hit['collection']}: {source}", _clip(text))
        table.add_row(*(Text(cell) for cell in cells))
    Console().print(table)


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
