"""The optional parts of the install (pyproject's extras) and the message when one is missing.

Core code imports an extra's packages only where it uses them, and asks `missing_extra` first
so that a missing package reads as the `pip install` line that brings it."""

from __future__ import annotations

from importlib.util import find_spec

# Each extra and the modules its packages provide (pyproject.toml's optional-dependencies).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "onnx": ("onnx", "onnxruntime"),
    "parquet": ("pyarrow",),
    "finetune": ("datasets", "accelerate"),
    "mcp": ("mcp",),
    "langchain": ("langchain_core",),
    "llamaindex": ("llama_index.core",),
    "otel": (
        "opentelemetry.sdk",
        "opentelemetry.exporter.otlp.proto.http",
        "opentelemetry.instrumentation.sqlalchemy",
        "opentelemetry.instrumentation.httpx",
        "greenlet",
    ),
    "tiktoken": ("tiktoken",),
    "ocr": ("pytesseract",),
    "s3": ("boto3",),
}


def missing_extra(extra: str, purpose: str) -> str | None:
    """None when every package of `extra` is importable; else a message saying what `purpose`
    lacks and how to install it."""
    absent = [module for module in EXTRA_MODULES[extra] if not _importable(module)]
    if not absent:
        return None
    verb = "is" if len(absent) == 1 else "are"
    return (
        f"{purpose} needs {' and '.join(absent)}, which {verb} not installed "
        f"(pip install 'ragservice[{extra}]')"
    )


def _importable(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is absent
        return False
