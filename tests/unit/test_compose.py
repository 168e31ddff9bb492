"""docker-compose.yml's wiring: a primary with replication, a replica copied from it, the app
pointed at both, the GPU, inference and Citus profiles, pinned images, loopback ports and no
password in the file. No Docker engine needed: the file is read, not run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    found = compose["services"]
    assert isinstance(found, dict)
    return found


def _environment(service: dict[str, Any]) -> dict[str, str]:
    """`environment:` as a mapping, whether written as a mapping or as a list of K=V."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(item) for item in value]


def _script(service: dict[str, Any]) -> str:
    """Entrypoint and command together, with shell line continuations joined."""
    text = "\n".join(_as_list(service.get("entrypoint")) + _as_list(service.get("command")))
    return text.replace("\\\n", " ")


def _invocation(script: str, program: str) -> list[str]:
    """The arguments of the first call of `program` in a shell script."""
    for line in script.splitlines():
        words = shlex.split(line, comments=True)
        if program in words:
            return words[words.index(program) + 1 :]
    raise AssertionError(f"{program} is never called")


def _option(args: list[str], short: str, long: str) -> str | None:
    for i, arg in enumerate(args):
        if arg in (short, long) and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(f"{long}="):
            return arg.split("=", 1)[1]
        if arg.startswith(short) and len(arg) > len(short) and not arg.startswith("--"):
            return arg[len(short) :]
    return None


def _server_settings(command: list[str]) -> dict[str, str]:
    """`-c name=value` pairs of a postgres command line."""
    settings = {}
    for i, arg in enumerate(command):
        if arg == "-c" and i + 1 < len(command):
            name, _, value = command[i + 1].partition("=")
            settings[name] = value
    return settings


def _depends_healthy(service: dict[str, Any], dependency: str) -> bool:
    depends = service.get("depends_on") or {}
    return isinstance(depends, dict) and (
        (depends.get(dependency) or {}).get("condition") == "service_healthy"
    )


def _profiles(service: dict[str, Any]) -> set[str]:
    return set(service.get("profiles") or [])


def _with_defaults(text: str) -> str:
    """Compose's interpolation with nothing set: `${VAR:-default}` gives the default."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", text)


def _pinned(image: str) -> bool:
    """A tag that names a release (x.y.z, or a build number), not one that moves."""
    _, _, tag = image.rpartition(":")
    return "/" not in tag and bool(re.search(r"\d+\.\d+\.\d+|(^|-)b\d+$", tag))


CITUS_NODES = ("citus-coordinator", "citus-worker1", "citus-worker2")
CITUS_WORKERS = CITUS_NODES[1:]
CITUS_SERVICES = {*CITUS_NODES, "citus-setup", "citus-migrate", "app-citus"}


def test_services_and_profiles(services: dict[str, Any]) -> None:
    """The databases and the migration always run; exactly one app per profile (cpu, gpu);
    the inference server and the Citus cluster only when asked for."""
    assert set(services) == {
        "primary",
        "replica",
        "migrate",
        "app",
        "app-gpu",
        "inference",
        *CITUS_SERVICES,
    }
    always = {name for name, service in services.items() if not _profiles(service)}
    assert always == {"primary", "replica", "migrate"}
    assert _profiles(services["app"]) == {"cpu"}
    assert _profiles(services["app-gpu"]) == {"gpu"}
    assert _profiles(services["inference"]) == {"inference"}


def test_the_gpu_app_is_the_app_with_cuda_torch_and_a_gpu(services: dict[str, Any]) -> None:
    app, gpu = services["app"], services["app-gpu"]
    assert _environment(gpu) == _environment(app)
    assert gpu["depends_on"] == app["depends_on"] and gpu["ports"] == app["ports"]
    # PyPI's torch for Linux is the CUDA build; the Dockerfile's default index is the CPU one.
    assert gpu["build"]["args"]["TORCH_INDEX"] == "https://pypi.org/simple"
    assert "args" not in (app["build"] if isinstance(app["build"], dict) else {})
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def test_the_inference_server_is_what_the_example_env_points_the_app_at(
    services: dict[str, Any],
) -> None:
    inference = services["inference"]
    args = _as_list(inference["command"])
    port = args[args.index("--port") + 1]
    assert args[args.index("--host") + 1] == "0.0.0.0"
    example = _example_env(commented=True)
    url = urlsplit(example["RAGSERVICE_INFERENCE_URL"])
    assert (url.hostname, str(url.port), url.path) == ("inference", port, "/v1")
    env = _environment(services["app"])
    assert env["RAGSERVICE_INFERENCE_URL"] == "${RAGSERVICE_INFERENCE_URL:-}"  # unset: extractive
    assert "RAGSERVICE_INFERENCE_MODEL" in env
    assert (inference.get("healthcheck") or {}).get("test")


def _example_env(*, commented: bool = False) -> dict[str, str]:
    """.env.example's assignments (with `commented`, the commented-out ones too)."""
    pairs = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        line = line.strip()
        if commented and line.startswith("# ") and "=" in line and " " not in line[2:]:
            line = line[2:]
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            pairs[name] = value
    return pairs


def test_every_image_is_pinned_and_postgres_is_18_as_embedded(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    images = {name: service["image"] for name, service in services.items() if "image" in service}
    assert set(images) == {"primary", "replica", "inference", "citus-setup"}
    assert all(_pinned(image) for image in images.values()), images
    postgres = images["primary"]
    assert images["replica"] == postgres
    assert images["citus-setup"] == postgres  # for its psql
    assert re.fullmatch(r"pgvector/pgvector:0\.8\.\d+-pg18(-[a-z]+)?", postgres)
    # The tests' container (when Docker answers) is the same image.
    assert f'"{postgres}"' in (ROOT / "tests/conftest.py").read_text()


@pytest.mark.parametrize(
    ("image", "pinned"),
    [
        ("pgvector/pgvector:pg17", False),
        ("pgvector/pgvector:latest", False),
        ("pgvector/pgvector", False),
        ("python:3.11-slim", False),
        ("pgvector/pgvector:0.8.5-pg18-trixie", True),
        ("ghcr.io/ggml-org/llama.cpp:server-b8840", True),
        ("localhost:5000/image", False),
    ],
)
def test_pinned_tells_a_release_from_a_moving_tag(image: str, pinned: bool) -> None:
    assert _pinned(image) is pinned


def test_published_ports_bind_loopback_by_default(services: dict[str, Any]) -> None:
    published = {
        name: [_with_defaults(str(port)) for port in service.get("ports") or []]
        for name, service in services.items()
    }
    assert published["app"] == ["127.0.0.1:8000:8000"]
    assert published["replica"] == ["127.0.0.1:5433:5432"]  # analysts' read-only SQL
    for name, ports in published.items():
        for port in ports:
            assert port.startswith("127.0.0.1:"), (name, port)


def test_no_password_is_written_in_the_file(services: dict[str, Any]) -> None:
    """Every password comes from the environment (.env): required where it is defined, and
    only referenced inside connection URLs."""
    required = set()
    for name, service in services.items():
        for key, value in _environment(service).items():
            if "PASSWORD" in key:
                match = re.fullmatch(r"\$\{([A-Z_]+):\?[^}]+\}", value)
                assert match, (name, key, value)
                required.add(match.group(1))
            for url in re.findall(r"postgres(?:ql)?://\S+", value):
                password = urlsplit(url).password
                assert password and re.fullmatch(r"\$\{[A-Z_]+\}", password), (name, key)
                assert password[2:-1] in required | {"SERVICE_PASSWORD", "POSTGRES_PASSWORD"}
    assert required == {"POSTGRES_PASSWORD", "REPLICATION_PASSWORD", "SERVICE_PASSWORD"}
    example = _example_env()
    assert {name: example.get(name) for name in required} == dict.fromkeys(required, "")
    assert example["COMPOSE_PROFILES"] == "cpu"
    for ignore in (".gitignore", ".dockerignore"):
        assert ".env" in (ROOT / ignore).read_text().split(), ignore


def test_models_are_offline_unless_allowed(services: dict[str, Any]) -> None:
    env = _environment(services["app"])
    assert env["HF_HUB_OFFLINE"] == "${HF_HUB_OFFLINE:-1}"
    mounts = [_with_defaults(str(volume)) for volume in services["app"]["volumes"]]
    assert "./models:/models:ro" in mounts


def test_databases_use_pgvector_and_every_service_has_a_healthcheck(
    services: dict[str, Any],
) -> None:
    for name, service in services.items():
        if service.get("restart") == "no":  # a one-shot task (migrate): it exits, it is not up
            continue
        healthcheck = service.get("healthcheck") or {}
        assert healthcheck.get("test") and not healthcheck.get("disable"), name


def test_primary_enables_streaming_replication(services: dict[str, Any]) -> None:
    primary = services["primary"]
    settings = _server_settings(_as_list(primary.get("command")))
    assert settings.get("wal_level") in ("replica", "logical")
    assert int(settings.get("max_wal_senders", "0")) >= 2
    env = _environment(primary)
    assert env.get("REPLICATION_USER")
    assert env.get("REPLICATION_PASSWORD")


def test_primary_init_script_creates_the_replication_role_and_hba_rule(
    services: dict[str, Any],
) -> None:
    mounts = [str(volume) for volume in services["primary"]["volumes"]]
    init = [m for m in mounts if ":/docker-entrypoint-initdb.d/" in m and "replication" in m]
    assert len(init) == 1
    host_path, container_path = init[0].split(":")[:2]
    assert container_path.endswith(".sh")
    script = (ROOT / host_path).read_text()
    assert re.search(r"CREATE ROLE .* WITH REPLICATION LOGIN PASSWORD", script)
    assert re.search(r"host replication %s all scram-sha-256.*pg_hba\.conf", script)


def test_replica_copies_the_primary_with_pg_basebackup(services: dict[str, Any]) -> None:
    replica = services["replica"]
    assert _depends_healthy(replica, "primary")
    script = _script(replica)
    args = _invocation(script, "pg_basebackup")
    assert "-R" in args or "--write-recovery-conf" in args
    assert _option(args, "-h", "--host") == "primary"
    assert _option(args, "-X", "--wal-method") == "stream"
    assert "-C" in args or "--create-slot" in args
    assert _option(args, "-S", "--slot")
    assert _invocation(script, "pg_isready")[:2] == ["-h", "primary"]
    # Only on an empty data directory, then the image's entrypoint runs postgres.
    assert "PG_VERSION" in script
    assert "docker-entrypoint.sh postgres" in script


def test_replica_script_escapes_dollars_for_compose(services: dict[str, Any]) -> None:
    """Compose substitutes `$VAR` from the host's environment; the script needs `$$VAR`."""
    assert "$" not in _script(services["replica"]).replace("$$", "")


def test_app_waits_for_the_primary_not_the_replica(services: dict[str, Any]) -> None:
    """The service reads from the primary while its replica is away: a replica that is slow
    to copy or down must not keep the app from starting."""
    app = services["app"]
    assert _depends_healthy(app, "primary")
    assert "replica" not in (app.get("depends_on") or {})
    assert app.get("build") in (".", {"context": "."})


def test_postgres_18_volumes_hold_the_versioned_data_directory(services: dict[str, Any]) -> None:
    """PostgreSQL 18's image keeps PGDATA in /var/lib/postgresql/18/docker: a volume on the
    old /var/lib/postgresql/data would leave the data outside it."""
    for name in ("primary", "replica"):
        targets = [str(volume).split(":")[1] for volume in services[name]["volumes"]]
        assert "/var/lib/postgresql" in targets, name


def test_app_writes_to_the_primary(services: dict[str, Any]) -> None:
    url = urlsplit(_environment(services["app"])["RAGSERVICE_DATABASE_URL"])
    assert url.scheme.startswith("postgres")
    assert url.hostname == "primary"


def test_app_reads_from_the_replica_of_its_region(services: dict[str, Any]) -> None:
    env = _environment(services["app"])
    pairs = [item.split("=", 1) for item in env["RAGSERVICE_REPLICAS"].split(",")]
    replicas = {region.strip(): urlsplit(url.strip()) for region, url in pairs}
    assert env["RAGSERVICE_REGION"] in replicas
    assert replicas[env["RAGSERVICE_REGION"]].hostname == "replica"


def test_declared_volumes_are_the_ones_used(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    declared = set(compose.get("volumes") or {})
    used = {
        _with_defaults(str(volume)).split(":")[0]
        for service in services.values()
        for volume in service.get("volumes") or []
    }
    named = {source for source in used if not source.startswith((".", "/", "~"))}
    assert declared
    assert named == declared


def test_the_owner_migrates_and_the_app_logs_in_as_a_plain_role(services: dict[str, Any]) -> None:
    """Only `migrate` holds the owner's password; the app's login is created without any
    privilege that could leave row-level security, and given the service's two roles."""
    owner = _environment(services["primary"])["POSTGRES_USER"]
    migrate = services["migrate"]
    assert _depends_healthy(migrate, "primary")
    assert _as_list(migrate["command"])[-2:] == ["db", "upgrade"]
    assert urlsplit(_environment(migrate)["RAGSERVICE_DATABASE_URL"]).username == owner

    app = services["app"]
    assert (app["depends_on"]["migrate"] or {}).get("condition") == (
        "service_completed_successfully"
    )
    env = _environment(app)
    login = _environment(services["primary"])["SERVICE_USER"]
    urls = [env["RAGSERVICE_DATABASE_URL"]] + [
        item.split("=", 1)[1] for item in env["RAGSERVICE_REPLICAS"].split(",")
    ]
    assert {urlsplit(url).username for url in urls} == {login} and login != owner
    assert "RAGSERVICE_OWNER_DATABASE_URL" not in env
    assert not any(owner_password_in(value, services) for value in env.values())

    mounts = {str(volume).split(":")[1] for volume in services["primary"]["volumes"]}
    assert "/docker-entrypoint-initdb.d/20-service-login.sh" in mounts
    script = (ROOT / "deploy/postgres/init-service-login.sh").read_text()
    created = re.search(r'CREATE ROLE :"service_user" WITH (.*?);', script, re.S)
    assert created is not None
    attributes = created.group(1).split()
    assert "LOGIN" in attributes
    assert {"NOSUPERUSER", "NOBYPASSRLS", "NOCREATEROLE"} <= set(attributes)
    assert re.search(r'GRANT ragservice_service, ragservice_system TO :"service_user"', script)


def owner_password_in(value: str, services: dict[str, Any]) -> bool:
    password = _environment(services["primary"])["POSTGRES_PASSWORD"]
    return urlsplit(value).password == password if "://" in value else False


# --- the `citus` profile ---------------------------------------------------------------------


def _node_image(service: dict[str, Any]) -> str:
    """The image a service runs: `image:`, or the FROM of the Dockerfile it is built from."""
    if "image" in service:
        return str(service["image"])
    return _base_image(_dockerfile(service))


def _dockerfile(service: dict[str, Any]) -> Path:
    build = service["build"]
    if isinstance(build, str):
        build = {"context": build}
    return ROOT / build["context"] / build.get("dockerfile", "Dockerfile")


def _base_image(dockerfile: Path) -> str:
    """The last stage's base image (ARG defaults filled in)."""
    args: dict[str, str] = {}
    base = None
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["ARG"] and "=" in words[1]:
            name, _, value = words[1].partition("=")
            args[name] = value
        elif words[:1] == ["FROM"]:
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[1])
    assert base is not None, dockerfile
    return base


def _citus_on_postgres_18(image: str) -> bool:
    """citusdata/citus at a release of the PostgreSQL 18 line: Citus 14's unsuffixed tags are
    built on PostgreSQL 18 (its -pg16 and -pg17 tags on the older servers), or a -pg18 tag."""
    return bool(re.fullmatch(r"citusdata/citus:14\.\d+\.\d+(-pg18)?", image))


@pytest.mark.parametrize(
    ("image", "pg18"),
    [
        ("citusdata/citus:14.1.0", True),
        ("citusdata/citus:14.0.0-pg18", True),
        ("citusdata/citus:14.1.0-pg17", False),
        ("citusdata/citus:13.2.0", False),  # PostgreSQL 17
        ("citusdata/citus:14.1", False),  # not a release: moves with every 14.1.x
        ("citusdata/citus:latest", False),
        ("pgvector/pgvector:0.8.5-pg18-trixie", False),
    ],
)
def test_citus_on_postgres_18_tells_the_tags(image: str, pg18: bool) -> None:
    assert _citus_on_postgres_18(image) is pg18


def test_the_citus_profile_holds_the_cluster_the_setup_and_the_app(
    services: dict[str, Any],
) -> None:
    """Every Citus service carries `profiles: [citus]` (a service without profiles would start
    with a plain `docker compose up`), and nothing else is in that profile."""
    in_profile = {name for name, service in services.items() if "citus" in _profiles(service)}
    assert in_profile == CITUS_SERVICES
    for name in CITUS_SERVICES:
        assert _profiles(services[name]) == {"citus"}, name
    # No service outside the profile talks to a Citus node.
    for name, service in services.items():
        if name not in CITUS_SERVICES:
            text = str(service)
            assert not any(node in text for node in CITUS_NODES), name


def test_citus_nodes_run_citus_on_postgres_18_with_pgvector(services: dict[str, Any]) -> None:
    images = {name: _node_image(services[name]) for name in CITUS_NODES}
    assert len(set(images.values())) == 1, images
    (image,) = set(images.values())
    assert _citus_on_postgres_18(image) and _pinned(image), image
    # The official image has no pgvector: the nodes' Dockerfile installs it, for PostgreSQL 18.
    for name in CITUS_NODES:
        dockerfile = _dockerfile(services[name]).read_text()
        assert re.search(r"apt-get install .*postgresql-18-pgvector", dockerfile), name


def test_citus_nodes_are_checked_stored_and_logged_into_like_the_primary(
    services: dict[str, Any],
) -> None:
    primary = _environment(services["primary"])
    volumes: list[str] = []
    for name in CITUS_NODES:
        node = services[name]
        test = " ".join(_as_list(node["healthcheck"]["test"]))
        assert "pg_isready -h 127.0.0.1 -p 5432" in test, name
        assert node.get("restart") == "unless-stopped", name
        env = _environment(node)
        for key in ("POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"):
            assert env[key] == primary[key], (name, key)
        data = [str(v).split(":")[0] for v in node["volumes"] if ":/var/lib/postgresql" in str(v)]
        assert len(data) == 1, name
        volumes += data
    # A volume of its own for each node, none shared with the primary or the replica.
    others = {str(v).split(":")[0] for n in ("primary", "replica") for v in services[n]["volumes"]}
    assert len(set(volumes)) == len(CITUS_NODES) and not set(volumes) & others
    # The coordinator makes the service's login, like the primary (workers receive it).
    coordinator = services["citus-coordinator"]
    mounts = {str(volume).split(":")[1] for volume in coordinator["volumes"]}
    assert "/docker-entrypoint-initdb.d/20-service-login.sh" in mounts
    assert _environment(coordinator)["SERVICE_USER"] == primary["SERVICE_USER"]


def _setup_sql(services: dict[str, Any]) -> str:
    return _script(services["citus-setup"])


def test_citus_setup_registers_the_workers_once_the_nodes_are_healthy(
    services: dict[str, Any],
) -> None:
    setup = services["citus-setup"]
    assert setup.get("restart") == "no"  # one-shot
    for name in CITUS_NODES:
        assert _depends_healthy(setup, name), name
    env = _environment(setup)
    assert env["PGHOST"] == "citus-coordinator"
    assert _invocation(_setup_sql(services), "psql")[:2] == ["-v", "ON_ERROR_STOP=1"]
    sql = _setup_sql(services)
    assert re.search(r"citus_set_coordinator_host\('citus-coordinator',\s*5432\)", sql)
    added = re.findall(r"citus_add_node\('([^']+)',\s*(\d+)\)", sql)
    assert sorted(added) == [(name, "5432") for name in CITUS_WORKERS]
    # The workers ask for passwords: the coordinator has them for the owner and the login.
    assert "pg_dist_authinfo" in sql
    assert "$" not in sql.replace("$$", "")  # compose would substitute a lone `$`


def test_citus_setup_lets_set_local_reach_the_workers(services: dict[str, Any]) -> None:
    """The service's row-level security reads SET LOCAL settings (tenant, readers) on the
    workers: without citus.propagate_set_commands = 'local' they see none and fail closed."""
    sql = _setup_sql(services)
    altered = re.search(r"ALTER SYSTEM SET citus\.propagate_set_commands\s*=\s*'local'", sql)
    assert altered is not None
    reload = sql.find("pg_reload_conf()", altered.end())
    assert reload > 0


def test_the_citus_app_is_the_app_pointed_at_the_coordinator(services: dict[str, Any]) -> None:
    app, citus = services["app"], services["app-citus"]
    assert citus["build"] == app["build"]
    assert citus["healthcheck"] == app["healthcheck"]
    assert citus["restart"] == app["restart"]
    env, base = _environment(citus), _environment(app)
    url = urlsplit(env["RAGSERVICE_DATABASE_URL"])
    assert (url.hostname, url.port, url.path) == ("citus-coordinator", 5432, "/ragservice")
    assert url.username == urlsplit(base["RAGSERVICE_DATABASE_URL"]).username  # not the owner
    assert "RAGSERVICE_OWNER_DATABASE_URL" not in env
    assert env["RAGSERVICE_REPLICAS"] == ""  # the replica routing is not wired to Citus nodes
    different = {key for key in base.keys() | env.keys() if base.get(key) != env.get(key)}
    assert different == {"RAGSERVICE_DATABASE_URL", "RAGSERVICE_REPLICAS"}
    depends = citus["depends_on"]
    assert "primary" not in depends and "migrate" not in depends
    for step in ("citus-setup", "citus-migrate"):
        assert depends[step]["condition"] == "service_completed_successfully", step
    assert _depends_healthy(citus, "citus-coordinator")
    # Its own data volume and port, so that it runs beside `app`.
    assert "app-citus-data:/data" in citus["volumes"]
    assert [_with_defaults(port) for port in citus["ports"]] == ["127.0.0.1:8001:8000"]


def test_the_owner_migrates_the_coordinator_after_the_setup(services: dict[str, Any]) -> None:
    migrate = services["citus-migrate"]
    assert migrate.get("restart") == "no"
    assert migrate["build"] == services["migrate"]["build"]
    assert _as_list(migrate["command"]) == _as_list(services["migrate"]["command"])
    assert migrate["depends_on"]["citus-setup"]["condition"] == "service_completed_successfully"
    url = urlsplit(_environment(migrate)["RAGSERVICE_DATABASE_URL"])
    owner = _environment(services["primary"])["POSTGRES_USER"]
    assert (url.hostname, url.username) == ("citus-coordinator", owner)
