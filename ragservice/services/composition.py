"""What a process of the service runs on, built from its settings in one place: the serving
runtime (the API's and the job workers'), and the search and answering services over one
searcher (the API's, and the CLI's local `search` and `ask`). The MCP server builds none of
them: it reaches the service through its REST client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ragservice import runtime as runtimes
from ragservice.answering.inference import InferenceClient
from ragservice.config import Settings
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from ragservice.metrics import Metrics
from ragservice.retrieval.search import Searcher
from ragservice.runtime import Runtime
from ragservice.services.answers import AnswerService, open_pipeline
from ragservice.services.search import SearchService, open_searcher


def open_serving_runtime(
    settings: Settings, *, embedder: SentenceTransformerEmbedder | None = None
) -> Runtime:
    """The runtime of a serving process (a server, a job worker): the embedded server
    supervised; refused, and closed, when its login could leave row-level security."""
    # By the module's name: a test that serves its own model replaces `open_runtime` there.
    runtime = runtimes.open_runtime(settings, embedder=embedder, supervise=True)
    try:
        runtimes.require_unprivileged_login(runtime.db, settings.security)
    except BaseException:
        runtime.close()
        raise
    return runtime


@dataclass(frozen=True)
class QueryServices:
    search: SearchService
    answers: AnswerService


@contextmanager
def search_service(runtime: Runtime) -> Iterator[SearchService]:
    """The search service on the runtime's serving model; its searcher closed at the end."""
    with open_searcher(runtime.db, runtime.models) as searcher:
        yield _search(runtime, searcher)


@contextmanager
def query_services(
    runtime: Runtime, *, inference: InferenceClient | None, metrics: Metrics
) -> Iterator[QueryServices]:
    """The search and the answering services over one searcher, the reranker loaded and the
    inference client (None: extractive answers) given; closed at the end, the caller closes
    `inference`."""
    settings = runtime.settings
    with open_searcher(runtime.db, runtime.models) as searcher:
        pipeline = open_pipeline(
            runtime.db,
            runtime.models,
            settings,
            searcher=searcher,
            inference=inference,
            metrics=metrics,
        )
        try:
            answers = AnswerService(
                runtime.db, search=settings.search, limits=settings.limits, pipeline=pipeline
            )
            yield QueryServices(_search(runtime, searcher), answers)
        finally:
            pipeline.close()


def _search(runtime: Runtime, searcher: Searcher) -> SearchService:
    settings = runtime.settings
    return SearchService(
        runtime.db,
        runtime.models,
        search=settings.search,
        limits=settings.limits,
        searcher=searcher,
    )
