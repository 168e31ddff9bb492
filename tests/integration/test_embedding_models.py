"""Embedding model versions against a real PostgreSQL: fine-tune and register, re-embed
(interrupted and resumed), activation refused until complete, activate and roll back, the
registry following the active row, dropping a model's embeddings, and the CLI commands."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select, text
from typer.testing import CliRunner

from ingest.pipeline import IngestPipeline
from ragservice import store
from ragservice.config import Settings, get_settings
from ragservice.db.models import EmbeddingModel, ModelActivation
from ragservice.embedding import registry
from ragservice.embedding.embedder import SentenceTransformerEmbedder, Vectors
from ragservice.embedding.finetune import BaseModel, TrainingOptions, finetune, resolve_base
from ragservice.embedding.reembed import count_missing, reembed
from ragservice.errors import ConflictError, InvalidInputError, NotFoundError
from ragservice.runtime import Runtime, open_runtime
from ragservice.types import LoadedDocument
from tests.tiny_models import TOPIC_WORDS

TOPICS = TOPIC_WORDS[:7]


@pytest.fixture
def runtime(settings: Settings, embedder: SentenceTransformerEmbedder) -> Iterator[Runtime]:
    """The bundled MiniLM serving one collection of seven one-chunk documents."""
    rt = open_runtime(settings, embedder=embedder)
    docs = [
        LoadedDocument(external_id=word, text=f"A note about the {word}.", title=word)
        for word in TOPICS
    ]
    pipeline = IngestPipeline(
        rt.db,
        embedder,
        model_id=rt.model_id,
        tenant_id=rt.default_tenant_id,
        chunking=rt.chunking_options(),
    )
    assert pipeline.run(docs, collection="notes").ok
    yield rt
    rt.close()


def register_tiny(runtime: Runtime, path: Path, name: str = "tiny") -> EmbeddingModel:
    with runtime.db.write() as session:
        return store.embedding_models.register_model_version(
            session,
            name=name,
            version=store.embedding_models.next_model_version(session, name),
            dimension=32,
            path=str(path),
            base_model_id=None,
            details={},
            hnsw_m=16,
            hnsw_ef_construction=64,
        )


def embed_all(runtime: Runtime, row: EmbeddingModel) -> None:
    loaded = registry.load_embedder(runtime.settings, row)
    reembed(runtime.db, runtime.settings.indexing, row, loaded, batch_size=3)


def chunk_texts(runtime: Runtime) -> dict[Any, str]:
    with runtime.db.read() as session:
        return dict(session.execute(text("SELECT id, text FROM chunks")).all())  # type: ignore[arg-type]


def stored_vectors(runtime: Runtime, model_id: int) -> dict[Any, np.ndarray[Any, Any]]:
    with runtime.db.read() as session:
        rows = session.execute(
            text("SELECT chunk_id, embedding FROM chunk_embeddings WHERE model_id = :m"),
            {"m": model_id},
        )
        return {row[0]: row[1].to_numpy() for row in rows}


def index_exists(runtime: Runtime, model_id: int) -> bool:
    with runtime.db.read() as session:
        found = session.scalar(
            text("SELECT count(*) FROM pg_indexes WHERE indexname = :n"),
            {"n": f"chunk_embeddings_hnsw_model_{model_id}"},
        )
    return bool(found)


# -- re-embedding ----------------------------------------------------------------------------


class FailsAfter:
    """An embedder that embeds `batches` batches, then fails as a killed process would."""

    def __init__(self, inner: SentenceTransformerEmbedder, batches: int) -> None:
        self.inner = inner
        self.left = batches
        self.calls: list[int] = []

    def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls.append(len(texts))
        if self.left == 0:
            raise KeyboardInterrupt
        self.left -= 1
        return self.inner.embed(texts)


def test_reembed_interrupted_then_resumed_embeds_only_the_rest(
    runtime: Runtime, tiny_path: Path
) -> None:
    tiny = register_tiny(runtime, tiny_path)
    loaded = registry.load_embedder(runtime.settings, tiny)
    assert count_missing(runtime.db, tiny.id) == len(TOPICS)
    failing = FailsAfter(loaded, batches=1)
    with pytest.raises(KeyboardInterrupt):
        reembed(runtime.db, runtime.settings.indexing, tiny, failing, batch_size=3)
    assert failing.calls == [3, 3]
    assert len(stored_vectors(runtime, tiny.id)) == 3  # the first batch, whole
    assert count_missing(runtime.db, tiny.id) == len(TOPICS) - 3

    progress: list[int] = []
    report = reembed(
        runtime.db, runtime.settings.indexing, tiny, loaded, batch_size=3, on_batch=progress.append
    )
    assert (report.missing_at_start, report.embedded, report.batches) == (4, 4, 2)
    assert progress == [3, 1]
    vectors = stored_vectors(runtime, tiny.id)
    texts = chunk_texts(runtime)
    assert set(vectors) == set(texts)
    # The stored texts, embedded as ingest embeds them: identical to embedding them now.
    ids = sorted(texts)
    expected = loaded.embed([texts[i] for i in ids])
    np.testing.assert_allclose(np.stack([vectors[i] for i in ids]), expected, atol=1e-5)
    # MiniLM's own embeddings are untouched, and a third run has nothing to do.
    assert len(stored_vectors(runtime, runtime.model_id)) == len(TOPICS)
    again = reembed(runtime.db, runtime.settings.indexing, tiny, loaded, batch_size=3)
    assert (again.missing_at_start, again.embedded, again.batches) == (0, 0, 0)


# -- activation and rollback -----------------------------------------------------------------


def test_activation_is_refused_until_every_chunk_is_embedded(
    runtime: Runtime, tiny_path: Path
) -> None:
    tiny = register_tiny(runtime, tiny_path)
    with pytest.raises(ConflictError, match=r"no embedding for 7 chunks.*reembed --model tiny:1"):
        registry.activate(runtime.db, "tiny")
    forced = registry.activate(runtime.db, "tiny", force=True)
    assert forced.changed and forced.model.id == tiny.id


def test_activate_and_rollback_record_each_switch(runtime: Runtime, tiny_path: Path) -> None:
    base = runtime.model_id
    tiny = register_tiny(runtime, tiny_path)
    embed_all(runtime, tiny)
    switched = registry.activate(runtime.db, "tiny:1")
    assert (switched.model.id, switched.previous_id, switched.changed) == (tiny.id, base, True)
    assert registry.activate(runtime.db, "tiny").changed is False  # already active: no record
    back = registry.rollback(runtime.db)
    assert (back.model.id, back.previous_id) == (base, tiny.id)
    with runtime.db.read() as session:
        active = [m.id for m in store.embedding_models.list_models(session) if m.active]
        history = session.execute(
            select(ModelActivation.model_id, ModelActivation.previous_model_id).order_by(
                ModelActivation.id
            )
        ).all()
    assert active == [base]
    assert [tuple(row) for row in history] == [(tiny.id, base), (base, tiny.id)]
    # A second rollback undoes the first.
    assert registry.rollback(runtime.db).model.id == tiny.id


def test_rollback_without_history_and_unknown_models_are_clear_errors(runtime: Runtime) -> None:
    with pytest.raises(ConflictError, match="nothing to roll back to"):
        registry.rollback(runtime.db)
    with pytest.raises(NotFoundError, match=r"no embedding model 'nope'.*all-MiniLM-L6-v2:1"):
        registry.activate(runtime.db, "nope")
    assert registry.parse_model_ref("a:b:2") == ("a:b", 2)
    assert registry.parse_model_ref("name") == ("name", None)


def test_the_registry_switches_after_loading_and_keeps_the_previous_model_loaded(
    runtime: Runtime, tiny_path: Path
) -> None:
    models = runtime.models
    base = models.current()
    tiny = register_tiny(runtime, tiny_path)
    embed_all(runtime, tiny)
    assert models.refresh() is False  # nothing changed
    registry.activate(runtime.db, "tiny")
    assert models.current() is base  # a switch happens at the next check, not before
    assert models.refresh() is True
    serving = models.current()
    assert serving.describe() == {
        "id": tiny.id,
        "name": "tiny",
        "version": 1,
        "dimension": 32,
        "storage": "float32",
        "precision": "float",
        "query_encoder": "onnx",
    }
    assert serving.embed_query("a river").shape == (32,)
    assert runtime.model_id == tiny.id and runtime.embedder is serving.embedder
    registry.rollback(runtime.db)
    assert models.refresh() is True
    assert models.current() is base  # still loaded: a rollback loads nothing


def test_a_model_that_cannot_load_is_never_served(runtime: Runtime, tmp_path: Path) -> None:
    broken = register_tiny(runtime, tmp_path / "gone")
    registry.activate(runtime.db, "tiny", force=True)
    base = runtime.models.current()
    assert runtime.models.refresh() is False
    assert runtime.models.current() is base
    assert broken.id != base.id


def test_open_runtime_serves_the_active_finetuned_model(
    runtime: Runtime, tiny_path: Path, settings: Settings
) -> None:
    tiny = register_tiny(runtime, tiny_path)
    embed_all(runtime, tiny)
    registry.activate(runtime.db, "tiny")
    fresh = open_runtime(settings)
    try:
        assert fresh.model_id == tiny.id
        assert fresh.models.current().dimension == fresh.embedder.dimension == 32
    finally:
        fresh.close()


def test_drop_embeddings_refuses_the_active_model_and_reembed_restores(
    runtime: Runtime, tiny_path: Path
) -> None:
    tiny = register_tiny(runtime, tiny_path)
    embed_all(runtime, tiny)
    with pytest.raises(ConflictError, match="is the active model"):
        registry.drop_embeddings(runtime.db, "sentence-transformers/all-MiniLM-L6-v2")
    row, deleted = registry.drop_embeddings(runtime.db, "tiny")
    assert (row.id, deleted) == (tiny.id, len(TOPICS))
    assert stored_vectors(runtime, tiny.id) == {}
    assert not index_exists(runtime, tiny.id)
    embed_all(runtime, tiny)
    assert index_exists(runtime, tiny.id)
    assert len(stored_vectors(runtime, tiny.id)) == len(TOPICS)


# -- fine-tuning -----------------------------------------------------------------------------


def triplets() -> list[dict[str, str]]:
    words = TOPIC_WORDS[:8]
    return [
        {
            "anchor": f"what about the {word}?",
            "positive": f"a note about the {word}",
            "negative": f"a note about the {words[(i + 1) % len(words)]}",
        }
        for i, word in enumerate(words)
    ]


def test_finetune_registers_a_new_inactive_version_that_loads(
    runtime: Runtime, tiny_path: Path
) -> None:
    options = TrainingOptions(batch_size=4, max_steps=2, held_out=0.25, device="cpu")
    base = BaseModel(path=str(tiny_path), label="tiny folder")
    first = finetune(
        runtime.db, runtime.settings, triplets(), name="tuned", base=base, options=options
    )
    assert first.path == runtime.settings.database.data_dir.resolve() / "models" / "tuned-v1"
    row = first.model
    assert (row.name, row.version, row.dimension, row.active) == ("tuned", 1, 32, False)
    details = row.details
    assert details["data"]["train_questions"] == 6 and details["data"]["held_out_questions"] == 2
    assert set(details["held_out"]["before"]) == {"triplet_accuracy", "ndcg@10", "mrr@10"}
    assert set(details["held_out"]["after"]) == set(details["held_out"]["before"])
    assert details["training"]["steps"] == 2
    assert details["hyperparameters"]["max_steps"] == 2
    assert index_exists(runtime, row.id)
    loaded = SentenceTransformerEmbedder(str(first.path), device="cpu")
    loaded.warm_up()
    assert loaded.embed(["a note about the river"]).shape == (1, 32)
    # The same name again is the next version; nothing is left behind but the two folders.
    second = finetune(
        runtime.db, runtime.settings, triplets(), name="tuned", base=base, options=options
    )
    assert second.model.version == 2 and second.path.name == "tuned-v2"
    assert sorted(p.name for p in (runtime.settings.database.data_dir / "models").iterdir()) == [
        "tuned-v1",
        "tuned-v2",
    ]
    with runtime.db.read() as session:
        assert store.embedding_models.active_model(session).id == runtime.model_id  # type: ignore[union-attr]


def test_finetune_refuses_no_data_bad_names_and_unknown_bases(runtime: Runtime) -> None:
    base = resolve_base(runtime.db, runtime.settings.embedding, None)
    assert base.model_id == runtime.model_id  # the active model by default
    options = TrainingOptions(device="cpu")
    with pytest.raises(InvalidInputError, match="no training triplets"):
        finetune(runtime.db, runtime.settings, [], name="x", base=base, options=options)
    with pytest.raises(InvalidInputError, match="model name"):
        finetune(runtime.db, runtime.settings, triplets(), name="a/b", base=base, options=options)
    with pytest.raises(NotFoundError, match="unknown base model 'nope'"):
        resolve_base(runtime.db, runtime.settings.embedding, "nope")


# -- the CLI ---------------------------------------------------------------------------------


@pytest.fixture
def cli(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    """The `ragservice` command in-process, on this test's database."""
    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", runtime.db.url)
    monkeypatch.setenv("RAGSERVICE_DATA_DIR", str(runtime.settings.database.data_dir))
    monkeypatch.setenv("RAGSERVICE_DEVICE", "cpu")
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps long lines at 80 otherwise
    get_settings.cache_clear()
    yield CliRunner()
    get_settings.cache_clear()


def invoke(runner: CliRunner, *args: str) -> Any:
    from ragservice.cli import app

    return runner.invoke(app, list(args), catch_exceptions=False)


def test_cli_finetune_reembed_activate_rollback_and_list(
    cli: CliRunner, runtime: Runtime, tiny_path: Path, tmp_path: Path
) -> None:
    data = tmp_path / "triplets.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in triplets()))
    tuned = invoke(
        cli,
        *("finetune", "--triplets", str(data), "--base", str(tiny_path), "--out", "cli-tuned"),
        *("--max-steps", "1", "--batch-size", "4", "--held-out", "0.25"),
    )
    assert tuned.exit_code == 0, tuned.output
    summary = json.loads(tuned.stdout.strip().splitlines()[-1])
    assert summary["model"]["name"] == "cli-tuned" and summary["model"]["version"] == 1
    assert set(summary["held_out"]) == {"before", "after"}

    refused = invoke(cli, "models", "activate", "cli-tuned")
    assert refused.exit_code == 1 and "reembed --model cli-tuned:1" in refused.output
    embedded = invoke(cli, "reembed", "--model", "cli-tuned", "--batch-size", "4")
    assert embedded.exit_code == 0, embedded.output
    assert f"embedded {len(TOPICS)} chunks" in embedded.output
    nothing = invoke(cli, "reembed", "--model", "cli-tuned").output
    assert "every chunk has an embedding of cli-tuned:1" in nothing

    listed = json.loads(invoke(cli, "models", "list", "--json").stdout)
    by_name = {row["name"]: row for row in listed}
    assert by_name["cli-tuned"]["embedded"] == by_name["cli-tuned"]["chunks"] == len(TOPICS)
    assert by_name["cli-tuned"]["held_out"]["after"]

    activated = invoke(cli, "models", "activate", "cli-tuned:1")
    assert activated.exit_code == 0 and "activated cli-tuned:1" in activated.output
    assert invoke(cli, "models", "drop-embeddings", "cli-tuned").exit_code == 1
    rolled = invoke(cli, "models", "rollback")
    assert rolled.exit_code == 0 and "all-MiniLM-L6-v2:1" in rolled.output
    dropped = invoke(cli, "models", "drop-embeddings", "cli-tuned")
    assert dropped.exit_code == 0 and f"deleted {len(TOPICS)} embeddings" in dropped.output
    table = invoke(cli, "models", "list")
    assert table.exit_code == 0 and "cli-tuned" in table.output


def test_cli_finetune_needs_one_source_and_names_a_missing_base(cli: CliRunner) -> None:
    assert invoke(cli, "finetune", "--out", "x").exit_code == 2
    missing = invoke(cli, "finetune", "--from-feedback", "--out", "x", "--base", "nowhere")
    assert missing.exit_code == 1 and "unknown base model 'nowhere'" in missing.output
    empty = invoke(cli, "finetune", "--from-feedback", "--out", "x")
    assert empty.exit_code == 1 and "no training triplets" in empty.output


def test_reembed_of_an_inactive_model_builds_its_index_once_at_the_end(
    runtime: Runtime, tiny_path: Path
) -> None:
    tiny = register_tiny(runtime, tiny_path)
    seen: list[Any] = []
    loaded = registry.load_embedder(runtime.settings, tiny)
    report = reembed(
        runtime.db, runtime.settings.indexing, tiny, loaded, batch_size=3, on_index=seen.append
    )
    assert report.index is not None
    assert report.index.rows == report.embedded == len(TOPICS)
    assert seen[-1].phase == "done" and seen[-1].tuples_done == len(TOPICS)
    with runtime.db.read() as session:
        assert store.indexes.has_index(session, tiny.id)


def test_the_registry_follows_a_storage_conversion_of_the_serving_model(
    runtime: Runtime,
) -> None:
    from ragservice.embedding import indexing

    models = runtime.models
    with runtime.db.read() as session:
        row = store.embedding_models.get_model(session, models.current().id)
    assert row is not None and models.current().storage == "float32"
    indexing.convert_storage(runtime.db, row, "halfvec")
    assert models.refresh() is True
    assert models.current().storage == "halfvec"
    assert models.current().embedder is not None
    assert models.refresh() is False
