"""The dependency direction of the layout: leaves stay leaves, nothing imports the top layers.

The layers, bottom up (docs/architecture.md draws them):
0. leaves: config, errors, types, timing, metrics, periodic, extras: import nothing internal;
   and `limits/` (every kind of limit), `observability/` (traces, log lines) and `readers`
   (principals and reader lists), which import those leaves only;
1. `db/`: engines, models, migrations, routing, tenancy;
2. `store/`: the SQL on tenant data, one module per subject;
3. the capabilities: chunking, `retrieval/`, `embedding/`, `cache/`, `answering/`, `feedback/`,
   `auth/`, `safety/`, `retention` (the retention purge): they may use each other; and `client`,
   the REST API's HTTP client, with `integrations/`, the LangChain and LlamaIndex retrievers over
   it;
4. `runtime`: opens the database and the serving model for a process, and `runtime_metrics`,
   what the metrics read from it at scrape time; `mcp_server/`, the MCP server, a front end
   that reaches the service through `client` only; `console/`, the web console's static files,
   which the API serves;
5. `ingest/`: loaders, the ingest pipeline and the job worker;
6. `services/`: what the service does (search, answer, ingest, jobs, documents), called alike
   by every interface;
7. the composition roots `api/` and `cli/`, which may import anything (`cli/` alone imports the
   development cluster in `dev/`), except that no command but `serve` imports `api/`.
A module imports only from its own layer or below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            # `from ragservice import store` imports the module ragservice.store.
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def internal(path: Path) -> set[str]:
    return {n for n in imports_of(path) if n.split(".")[0] in ("ragservice", "ingest")}


def service_modules() -> list[Path]:
    # `python -m ragservice` is an entry point: it starts the CLI.
    return [
        p
        for p in (ROOT / "ragservice").rglob("*.py")
        if not {"api", "cli", "services"} & set(p.relative_to(ROOT / "ragservice").parts)
        and p != ROOT / "ragservice" / "__main__.py"
    ]


@pytest.mark.parametrize("path", service_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_below_the_top_imports_api_cli_or_ingest(path: Path) -> None:
    # By whole names: `ragservice.client` is not `ragservice.cli`.
    top = {
        n
        for n in internal(path)
        if n.split(".")[:2] in (["ragservice", "api"], ["ragservice", "cli"])
    }
    assert {n for n in internal(path) if n.split(".")[0] == "ingest"} | top == set()


LEAVES = ("config", "errors", "types", "timing", "metrics", "periodic", "extras")
# Layer 0 too, but built on the leaves: they may import those and nothing else.
LEAF_PACKAGES = ("limits", "observability", "readers")
CAPABILITIES = (
    "chunking",
    "retrieval",
    "embedding",
    "cache",
    "answering",
    "feedback",
    "auth",
    "safety",
    "retention",
)


def layer(dotted: str) -> int:
    parts = dotted.split(".")
    if parts[0] == "ingest":
        return 5
    name = parts[1]
    if name in LEAVES or name in LEAF_PACKAGES:
        return 0
    ranks = {
        "db": 1,
        "store": 2,
        "client": 3,
        "integrations": 3,
        "runtime": 4,
        "runtime_metrics": 4,
        "mcp_server": 4,
        "console": 4,
        "dev": 5,
        "services": 6,
        "api": 7,
        "cli": 7,
    }
    if name in CAPABILITIES:
        return 3
    return ranks[name]


def dotted_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_modules() -> list[Path]:
    every = [*(ROOT / "ragservice").rglob("*.py"), *(ROOT / "ingest").rglob("*.py")]
    # `python -m ingest` is an entry point, a composition root like the CLI it starts.
    return sorted(p for p in every if p.name != "__main__.py" and dotted_name(p) != "ragservice")


@pytest.mark.parametrize("path", library_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_down_the_layers_only(path: Path) -> None:
    own = layer(dotted_name(path))
    upward = {n for n in internal(path) if n != "ragservice" and layer(n) > own}
    assert upward == set()


@pytest.mark.parametrize("path", library_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_cli_starts_the_development_cluster(path: Path) -> None:
    if dotted_name(path).startswith(("ragservice.cli", "ragservice.dev")):
        return
    assert {n for n in internal(path) if n.startswith("ragservice.dev")} == set()


@pytest.mark.parametrize("path", library_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_stay_small(path: Path) -> None:
    """Past ~600 lines a module has become a folder."""
    assert len(path.read_text().splitlines()) <= 600


def test_the_top_level_holds_at_most_a_dozen_modules() -> None:
    entry_points = ("__init__.py", "__main__.py")
    modules = [p.name for p in (ROOT / "ragservice").glob("*.py") if p.name not in entry_points]
    assert len(modules) <= 12, sorted(modules)


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "ragservice" / "cli").rglob("*.py")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_commands_other_than_serve_reach_the_service_through_the_service_layer(
    path: Path,
) -> None:
    """The CLI's local mode calls `services/`, as the routers do, never the REST layer."""
    if path.name == "serve.py":
        return
    assert {n for n in internal(path) if n.startswith("ragservice.api")} == set()


# Every command may hold the `Database` it opens and say whose rows its transactions see
# (`tenancy`); the SQL on them is the services'.
DB_FOR_EVERY_COMMAND = {"ragservice.db", "ragservice.db.Database", "ragservice.db.tenancy"}
# Work on the database server itself, which no service wraps: by module, each name needed.
DB_SERVER_WORK = {
    # `database()` opens the database for a command; `db optimize` runs the owner's steps.
    "common.py": {"ragservice.db.open_database", "ragservice.db.maintenance"},
    # `db upgrade` migrates; `db settings` reads the server's settings and sizes them, as the
    # owner; `db distribute` converts tables for Citus.
    "db.py": {
        "ragservice.db.migrate",
        "ragservice.db.server_settings",
        "ragservice.db.sizing",
        "ragservice.db.embedded",
        "ragservice.db.engine",
        "ragservice.db.distribution",
    },
    # `backup` and `restore` copy the embedded server's data directory.
    "backup.py": {"ragservice.db.backup"},
    # `serve` and `worker` bound how long the embedded server may take to stop.
    "serve.py": {"ragservice.db.embedded"},
    # `replicas status` probes the replicas through the router the server would build.
    "replicas.py": {"ragservice.db.engine"},
    # A large load checks for the owner's login before it runs `db optimize`'s steps.
    "ingest.py": {"ragservice.db.maintenance"},
    # The embedding model's row, as a type.
    "training.py": {"ragservice.db.models"},
}


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "ragservice" / "cli").rglob("*.py")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_commands_leave_the_sql_to_the_services(path: Path) -> None:
    """No command imports `store/`; of `db/`, only what `DB_SERVER_WORK` names for it."""
    allowed = DB_FOR_EVERY_COMMAND | DB_SERVER_WORK.get(path.name, set())
    used = {
        n
        for n in internal(path)
        if n.startswith(("ragservice.store", "ragservice.db"))
        and not any(n == a or n.startswith(f"{a}.") for a in allowed - {"ragservice.db"})
        and n != "ragservice.db"
    }
    assert used == set()


CLIENT_SIDE = ("mcp_server", "integrations")


@pytest.mark.parametrize(
    "path",
    sorted(p for side in CLIENT_SIDE for p in (ROOT / "ragservice" / side).rglob("*.py")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_mcp_server_and_the_integrations_reach_the_service_through_its_client(
    path: Path,
) -> None:
    """They call the REST API, so an API key scopes them as it scopes any caller."""
    allowed = ("client", "errors", "extras", *CLIENT_SIDE)
    used = {n.split(".")[1] for n in internal(path) if n != "ragservice"}
    assert used - set(allowed) == set()


def leaf_files(name: str) -> list[Path]:
    """A leaf's module, or every module of a leaf that has become a package (config/)."""
    package = ROOT / "ragservice" / name
    return sorted(package.rglob("*.py")) if package.is_dir() else [package.with_suffix(".py")]


@pytest.mark.parametrize(
    "path",
    [p for name in LEAVES for p in leaf_files(name)],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_leaves_import_nothing_internal(path: Path) -> None:
    """A leaf package's modules may import each other, nothing else internal."""
    own = f"ragservice.{path.relative_to(ROOT / 'ragservice').parts[0].removesuffix('.py')}"
    imported = {n for n in internal(path) if n != own and not n.startswith(f"{own}.")}
    assert imported == set()


@pytest.mark.parametrize(
    "path",
    [p for name in LEAF_PACKAGES for p in sorted((ROOT / "ragservice" / name).rglob("*.py"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_leaf_packages_import_leaves_only(path: Path) -> None:
    own = path.relative_to(ROOT / "ragservice").parts[0]
    allowed = {f"ragservice.{name}" for name in (*LEAVES, own)}
    imported = {n for n in internal(path) if n != "ragservice"}
    assert {n for n in imported if ".".join(n.split(".")[:2]) not in allowed} == set()


@pytest.mark.parametrize(
    "adapter",
    [
        "chunking.py",
        "answering/context.py",
        "embedding/embedder.py",
        "answering/inference.py",
        "answering/prompt.py",
        "retrieval/rerank.py",
        "safety/injection.py",
        "safety/links.py",
    ],
)
def test_adapters_never_touch_the_database(adapter: str) -> None:
    found = {
        n
        for n in internal(ROOT / "ragservice" / adapter)
        if n.startswith(("ragservice.db", "ragservice.store"))
    }
    assert found == set()


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "ragservice" / "api" / "routers").glob("*.py")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_router_imports_another_router(path: Path) -> None:
    """What routers share lives beside them (`api.charges`, `api.schemas.*`, `api.deps`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    relative = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    routers = {n for n in imports_of(path) if n.startswith("ragservice.api.routers")}
    assert (relative, routers) == ([], set())


def test_sql_on_documents_lives_in_the_store() -> None:
    """No module outside the db layer and `store/` writes SQL against the core tables."""
    # The ranking statements are composed SQL fragments, kept beside the searcher that runs them.
    allowed = {ROOT / "ragservice" / "retrieval" / "statements.py"}
    offenders = []
    for path in [*service_modules(), *(ROOT / "ingest").rglob("*.py")]:
        if path in allowed or {"db", "store"} & set(path.relative_to(ROOT).parts):
            continue
        source = path.read_text()
        if any(
            f"FROM {table}" in source or f"INTO {table}" in source
            for table in ("documents", "chunks", "chunk_embeddings")
        ):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


@pytest.mark.parametrize(
    "path",
    # `python -m ingest` is an entry point, a composition root like the CLI it starts.
    sorted(p for p in (ROOT / "ingest").rglob("*.py") if p.name != "__main__.py"),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_ingest_does_not_import_the_api_or_cli(path: Path) -> None:
    assert {
        n for n in internal(path) if n.startswith(("ragservice.api", "ragservice.cli"))
    } == set()


def test_the_query_services_are_built_in_one_place() -> None:
    """The API, the CLI and the workers get the search and answering services (and their
    searcher and pipeline) from `services/composition.py`, built alike for each."""
    builders = ("open_searcher(", "open_pipeline(", "SearchService(", "AnswerService(")
    fronts = [ROOT / "ragservice" / "api", ROOT / "ragservice" / "cli", ROOT / "ingest"]
    offenders = [
        str(path.relative_to(ROOT))
        for front in fronts
        for path in front.rglob("*.py")
        if any(builder in path.read_text() for builder in builders)
    ]
    assert offenders == []
