"""A reranker the service trains itself: `finetune --reranker` on triplets through the real
code path, registered and versioned, served by `NAME:VERSION` through `make_reranker`; an
unknown version and a crash halfway (nothing registered, no folder left) fail cleanly."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragservice import store
from ragservice.config import Settings, get_settings
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from ragservice.embedding.finetune import BaseModel
from ragservice.embedding.reranker_finetune import RerankerOptions, finetune_reranker
from ragservice.errors import ConfigurationError
from ragservice.retrieval.rerank import make_reranker
from ragservice.retrieval.reranker_registry import registered_folder
from ragservice.runtime import Runtime, open_runtime
from tests.tiny_models import TOPIC_WORDS, tiny_passage


@pytest.fixture
def runtime(settings: Settings, embedder: SentenceTransformerEmbedder) -> Iterator[Runtime]:
    rt = open_runtime(settings, embedder=embedder)
    yield rt
    rt.close()


def triplets() -> list[dict[str, str]]:
    rng = random.Random(0)
    return [
        {
            "anchor": word,
            "positive": tiny_passage(word, rng, relevant=True),
            "negative": tiny_passage(word, rng, relevant=False),
        }
        for word in TOPIC_WORDS[:8]
        for _ in range(2)
    ]


def test_a_trained_reranker_registers_versions_and_serves_by_name_and_version(
    runtime: Runtime,
    tiny_cross_encoder_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The tiny cross-encoder stands in for the embedding model's transformer: it already
    # matches words, so a few steps keep it ranking the passage with the query's word first.
    base = BaseModel(path=str(tiny_cross_encoder_path), label="tiny")
    options = RerankerOptions(
        batch_size=4, max_steps=3, held_out=0.25, max_length=32, negatives=1, device="cpu"
    )
    db, settings = runtime.db, runtime.settings
    first = finetune_reranker(
        db, settings.database, triplets(), name="tiny-rr", base=base, options=options
    )
    assert first.path == settings.database.data_dir.resolve() / "rerankers" / "tiny-rr-v1"
    assert (first.model.name, first.model.version, first.model.base) == ("tiny-rr", 1, "tiny")
    details = first.model.details
    assert details["data"]["train_questions"] == 6 and details["data"]["held_out_questions"] == 2
    assert set(details["held_out"]["after"]) == {"ndcg@10", "mrr@10", "pair_accuracy"}
    assert details["training"]["steps"] == 3 and details["hyperparameters"]["loss"] == "bce"

    # A crash halfway (here: at registration) leaves no row and no folder behind.
    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(store.rerankers, "register", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        finetune_reranker(
            db, settings.database, triplets(), name="tiny-rr", base=base, options=options
        )
    monkeypatch.undo()
    assert [p.name for p in (settings.database.data_dir / "rerankers").iterdir()] == ["tiny-rr-v1"]
    with db.read() as session:
        assert [r.version for r in store.rerankers.list_rerankers(session)] == [1]

    # RAGSERVICE_RERANKER=NAME:VERSION loads the registered folder.
    served = make_reranker(
        settings.model_copy(update={"reranker": "tiny-rr:1"}),
        resolve=lambda ref: registered_folder(db, ref),
    )
    assert served is not None and served.name == "tiny-rr:1"
    scores = served.rerank("river", ["the old river bridge", "a big apple garden"])
    assert scores.shape == (2,) and scores[0] > scores[1]
    assert registered_folder(db, "tiny-rr") == str(first.path)  # the latest version
    assert registered_folder(db, str(tiny_cross_encoder_path)) is None  # a path stays a path
    with pytest.raises(ConfigurationError, match=r"'tiny-rr:9': no such registered.*tiny-rr:1"):
        registered_folder(db, "tiny-rr:9")

    # The CLI: a second version of the same name, and the list.
    data = tmp_path / "triplets.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in triplets()))
    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", db.url)
    monkeypatch.setenv("RAGSERVICE_DATA_DIR", str(settings.database.data_dir))
    monkeypatch.setenv("RAGSERVICE_DEVICE", "cpu")
    get_settings.cache_clear()
    from ragservice.cli import app

    cli = CliRunner()
    args = ["finetune", "--reranker", "--triplets", str(data), "--out", "tiny-rr"]
    args += ["--base", str(tiny_cross_encoder_path), "--max-steps", "2", "--max-length", "32"]
    tuned = cli.invoke(app, args, catch_exceptions=False)
    assert tuned.exit_code == 0, tuned.output
    assert json.loads(tuned.stdout.strip().splitlines()[-1])["reranker"]["version"] == 2
    listed = cli.invoke(app, ["rerankers", "list", "--json"], catch_exceptions=False)
    assert [r["reference"] for r in json.loads(listed.stdout)] == ["tiny-rr:1", "tiny-rr:2"]
    assert cli.invoke(app, [*args[:-4], "--loss", "nope"]).exit_code == 2
    get_settings.cache_clear()
