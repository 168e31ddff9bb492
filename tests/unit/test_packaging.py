"""How the project installs: a lean core with optional extras, lock files that pin every
package, a Dockerfile that installs the lock before the code, a Makefile that installs the test
tools for tests only. The files are read, nothing is installed."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ragservice.extras import EXTRA_MODULES

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = {"datasets", "accelerate", "onnx", "onnxruntime", "pyarrow"}
TEST_TOOLS = {"pytest", "ruff", "mypy", "testcontainers", "schemathesis", "hypothesis"}


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    loaded = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert isinstance(loaded, dict)
    return loaded


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(line).name) for line in requirements}


def _locked(name: str) -> dict[str, str]:
    """A lock file's pins: package → version; every pin must carry hashes."""
    text = (ROOT / name).read_text().replace("\\\n", " ")
    pins = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = re.fullmatch(
            r"([A-Za-z0-9_.-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)\s*", line
        )
        assert match, line
        pins[match.group(1).lower()] = match.group(2)
    return pins


def test_core_dependencies_leave_out_fine_tuning_onnx_and_parquet(
    project: dict[str, Any],
) -> None:
    core = _names(project["dependencies"])
    assert not core & OPTIONAL
    assert not core & TEST_TOOLS
    assert "torch" in core and "sentence-transformers" in core


def test_each_extra_brings_the_modules_the_code_checks_for(project: dict[str, Any]) -> None:
    """`ragservice.extras` names the extra to install when its modules are missing: the
    extras and their packages must be the ones pyproject.toml declares (a dotted module is
    the package of its name with dashes: `opentelemetry.sdk`, `opentelemetry-sdk`)."""
    extras = project["optional-dependencies"]
    for extra, modules in EXTRA_MODULES.items():
        # A module's dotted name spelled as its distribution's (`llama_index.core`).
        assert _names(extras[extra]) == {canonicalize_name(m) for m in modules}, extra
    assert set(extras) == {*EXTRA_MODULES, "dev"}
    dev = {Requirement(line).name: Requirement(line) for line in extras["dev"]}
    assert dev["ragservice"].extras == set(EXTRA_MODULES)  # the tests exercise every extra
    assert set(dev) >= TEST_TOOLS


def test_the_license_file_matches_pyproject(project: dict[str, Any]) -> None:
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert "Version 2.0, January 2004" in (ROOT / "LICENSE").read_text()[:200]


def test_lock_files_pin_everything_with_hashes_and_agree() -> None:
    service, dev = _locked("requirements.lock"), _locked("requirements-dev.lock")
    # torch is installed first from the index of the wanted build (CPU or CUDA).
    assert "torch" not in service and "torch" not in dev
    assert not any(name.startswith("nvidia-") for name in dev)
    assert not set(service) & (TEST_TOOLS | {"datasets", "accelerate", "pandas"})
    assert {"onnxruntime", "onnx", "pyarrow", "sentence-transformers"} <= set(service)
    # Tracing and `ragservice mcp` are part of the service; the framework adapters are not.
    assert {"opentelemetry-sdk", "mcp"} <= set(service)
    assert not set(service) & {"langchain-core", "llama-index-core"}
    assert set(dev) >= (TEST_TOOLS | OPTIONAL)
    assert set(service) <= set(dev)
    assert {name: dev[name] for name in service} == service


def test_lock_files_pin_the_tested_floors(project: dict[str, Any]) -> None:
    """Each dependency's floor is satisfied by its locked version."""
    dev = _locked("requirements-dev.lock")
    extras = project["optional-dependencies"]
    declared = project["dependencies"] + [line for lines in extras.values() for line in lines]
    for line in declared:
        requirement = Requirement(line)
        if requirement.name in ("torch", "ragservice"):
            continue
        assert dev[requirement.name.lower()] in requirement.specifier, line


def _dockerfile_steps(stage: str) -> list[str]:
    """The instructions of one stage of the Dockerfile (continuation lines joined)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    instructions = [line for line in lines if line and not line.startswith("#")]
    stages: dict[str, list[str]] = {}
    current = ""
    for line in instructions:
        if line.startswith("FROM "):
            match = re.search(r"\bAS (\w+)$", line)
            current = match.group(1) if match else "runtime"
        stages.setdefault(current, []).append(line)
    return stages[stage]


def _index(steps: list[str], pattern: str) -> int:
    found = [i for i, step in enumerate(steps) if re.search(pattern, step)]
    assert found, pattern
    return found[0]


def test_dockerfile_installs_torch_then_the_lock_then_the_code() -> None:
    build = _dockerfile_steps("build")
    torch = _index(
        build, r"^RUN pip install torch==\$\{TORCH_VERSION\} --index-url \$\{TORCH_INDEX\}"
    )
    copy_lock = _index(build, r"^COPY requirements\.lock ")
    install_lock = _index(
        build, r"^RUN pip install --no-deps --require-hashes -r requirements\.lock"
    )
    first_code = _index(build, r"^COPY (ragservice|ingest|migrations|pyproject\.toml)")
    install_code = _index(build, r"^RUN pip install --no-deps \. ")
    extension = _index(build, r"^RUN .*make -C extension install")
    assert torch < copy_lock < install_lock < first_code < install_code < extension
    assert not any("requirements-dev.lock" in step or "[dev]" in step for step in build)
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG TORCH_VERSION=2\.13\.0$", text, re.M)
    assert re.search(r"^ARG TORCH_INDEX=https://download\.pytorch\.org/whl/cpu$", text, re.M)
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11\.\d+-slim", text, re.M)


def test_dockerfile_runtime_is_unprivileged_offline_by_default_and_serves() -> None:
    runtime = _dockerfile_steps("runtime")
    assert runtime[0] == "FROM ${PYTHON_IMAGE}"
    assert "COPY --from=build /opt/venv /opt/venv" in runtime
    assert not any(step.startswith(("RUN pip", "COPY ragservice")) for step in runtime)
    user = _index(runtime, r"^USER ")
    assert runtime[user] == "USER ragservice"
    assert runtime[-1] == 'CMD ["ragservice", "serve", "--host", "0.0.0.0"]'
    env = " ".join(step for step in runtime if step.startswith("ENV "))
    assert re.search(r"\bHF_HUB_OFFLINE=1\b", env)
    assert re.search(r"\bHF_HOME=/data/", env)  # downloads, when allowed, persist on the volume


def test_makefile_installs_test_tools_for_tests_only() -> None:
    text = (ROOT / "Makefile").read_text()
    rules = dict(re.findall(r"^([$()\w.-]+):([^=\n]*)$", text, re.M))
    assert rules["run"].split() == ["$(STAMP)", "$(BM25_STAMP)"]
    assert rules["test"].split() == ["$(DEV_STAMP)", "$(BM25_STAMP)", "browser", "ocr"]
    # OCR's tesseract, likewise from Debian; `run` tries to install it and goes on without.
    ocr = re.search(r"^ocr:.*?(?=^\S)", text, re.M | re.S)
    assert ocr is not None
    assert "--no-install-recommends tesseract-ocr tesseract-ocr-eng" in ocr.group(0)
    assert "if command -v tesseract >/dev/null; then exit 0; fi" in ocr.group(0)
    run = re.search(r"^run:.*?(?=^\S)", text, re.M | re.S)
    assert run is not None
    assert "$(MAKE) --no-print-directory ocr || echo" in run.group(0)
    # The browser tests' chromium comes from Debian's package, installed only when missing.
    browser = re.search(r"^browser:.*?(?=^\S)", text, re.M | re.S)
    assert browser is not None
    assert "apt-get install -y -q --no-install-recommends chromium" in browser.group(0)
    assert 'if [ -n "$(BROWSER)" ]; then exit 0; fi' in browser.group(0)
    runtime = re.search(r"^\$\(STAMP\):.*?(?=^\S)", text, re.M | re.S)
    assert runtime is not None
    assert "-r requirements.lock" in runtime.group(0)
    assert "dev" not in runtime.group(0).replace("requirements-dev", "")
    assert re.search(r"^HF_HUB_OFFLINE \?= 1$", text, re.M)  # `make run HF_HUB_OFFLINE=0`
    assert re.search(r"^TORCH_INDEX \?=", text, re.M)
    assert re.search(r"^TORCH_VERSION := 2\.13\.0$", text, re.M)
