"""A missing optional package reads as the extra that brings it, where the code needs it."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from ragservice.embedding.quantized import Int8EncoderError, load_int8_encoder
from ragservice.embedding.query_encoder import QueryEncoderError, load_onnx_encoder
from ragservice.extras import missing_extra


def _hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make `modules` unimportable, as when their packages are not installed."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def test_nothing_is_missing_when_the_packages_are_installed() -> None:
    assert missing_extra("onnx", "the ONNX query encoder") is None


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "onnxruntime")
    assert missing_extra("onnx", "int8 embedding") == (
        "int8 embedding needs onnxruntime, which is not installed (pip install 'ragservice[onnx]')"
    )
    _hide(monkeypatch, "datasets", "accelerate")
    assert missing_extra("finetune", "fine-tuning") == (
        "fine-tuning needs datasets and accelerate, which are not installed "
        "(pip install 'ragservice[finetune]')"
    )


def test_the_onnx_encoders_fail_with_the_extra_before_touching_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The embedder catches these errors and embeds with torch instead (a warning)."""
    _hide(monkeypatch, "onnx")
    pipeline = SimpleNamespace(device=SimpleNamespace(type="cpu"))
    with pytest.raises(QueryEncoderError, match=r"pip install 'ragservice\[onnx\]'"):
        load_onnx_encoder(pipeline, name="m", model_dir=None, cache_dir=None)  # type: ignore[arg-type]
    with pytest.raises(Int8EncoderError, match=r"needs onnx, which is not installed"):
        load_int8_encoder(pipeline, name="m", model_dir=None, cache_dir=None)  # type: ignore[arg-type]


def test_fine_tuning_without_its_extra_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ragservice.embedding import finetune
    from ragservice.errors import ConfigurationError

    _hide(monkeypatch, "accelerate")
    with pytest.raises(ConfigurationError, match=r"pip install 'ragservice\[finetune\]'"):
        finetune.finetune(
            None,  # type: ignore[arg-type]  # refused before the database is used
            None,  # type: ignore[arg-type]
            [],
            name="tuned",
            base=None,  # type: ignore[arg-type]
            options=finetune.TrainingOptions(),
        )


@pytest.mark.parametrize(
    ("module", "hidden", "extra"),
    [
        ("ragservice.integrations.langchain", "langchain_core", "langchain"),
        ("ragservice.integrations.llamaindex", "llama_index", "llamaindex"),
    ],
)
def test_a_retriever_without_its_framework_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, hidden: str, extra: str
) -> None:
    import importlib

    _hide(monkeypatch, hidden, *[name for name in sys.modules if name.startswith(f"{hidden}.")])
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError, match=rf"pip install 'ragservice\[{extra}\]'"):
        importlib.import_module(module)


def test_the_mcp_command_without_its_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from ragservice.cli import app

    _hide(monkeypatch, "mcp")
    result = CliRunner().invoke(app, ["mcp"], env={"COLUMNS": "250"})
    assert result.exit_code == 1
    assert "ragservice mcp needs mcp, which is not installed" in result.output
    assert "pip install 'ragservice[mcp]'" in result.output
