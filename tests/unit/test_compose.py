"""docker-compose.yml's wiring: a primary with replication, a replica copied from it, the app
pointed at both. No Docker engine needed: the file is read, not run."""

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


def test_four_services(services: dict[str, Any]) -> None:
    assert set(services) == {"primary", "replica", "migrate", "app"}


def test_databases_use_pgvector_and_every_service_has_a_healthcheck(
    services: dict[str, Any],
) -> None:
    assert services["primary"]["image"] == "pgvector/pgvector:pg17"
    assert services["replica"]["image"] == "pgvector/pgvector:pg17"
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


def test_app_depends_on_both_databases_being_healthy(services: dict[str, Any]) -> None:
    app = services["app"]
    assert _depends_healthy(app, "primary")
    assert _depends_healthy(app, "replica")
    assert app.get("build") in (".", {"context": "."})


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
        str(volume).split(":")[0]
        for service in services.values()
        for volume in service.get("volumes") or []
    }
    named = {source for source in used if not source.startswith((".", "/", "~"))}
    assert declared
    assert named == declared


def test_dockerfile_pins_cpu_torch_and_serves() -> None:
    dockerfile = ROOT / "Dockerfile"
    assert dockerfile.is_file()
    text = dockerfile.read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.MULTILINE)
    assert re.search(
        r"pip install torch==2\.13\.0 --index-url https://download\.pytorch\.org/whl/cpu", text
    )
    assert text.index("torch==2.13.0") < text.index("pip install .")
    assert re.search(r'CMD \["ragservice", "serve", "--host", "0\.0\.0\.0"\]', text)


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
