"""Feedback exports against a real PostgreSQL: each format on a small seeded log, filters,
tenant isolation, streaming from a server-side cursor, the feedback wait, and the CLI."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text, update

from ragservice import store
from ragservice.config import DEFAULT_TENANT_ID, Settings
from ragservice.db import Database, open_database, tenancy
from ragservice.db.models import Feedback, QueryLog
from ragservice.errors import InvalidInputError, NotFoundError
from ragservice.feedback.collect import FeedbackInput, submit_feedback
from ragservice.feedback.exports import ExportFilter, ExportFormat, ndjson, records, triplets
from ragservice.types import TextChunk

SYSTEM = {"role": "system", "content": "Answer from the sources."}
TEXTS = {
    "leave": "Parents get sixteen weeks of paid parental leave.",
    "holidays": "Staff get twenty-five days of holiday a year.",
    "travel": "Book flights through the travel desk two weeks ahead.",
    "laptops": "New staff receive a laptop on their first day.",
    "oncall": "On-call engineers are paid a weekly allowance.",
    "secret": "Globex pays a bonus for every shipped doomsday device.",
}


@dataclass
class Seeded:
    db: Database
    acme: uuid.UUID
    globex: uuid.UUID
    hr: uuid.UUID
    ops: uuid.UUID
    chunk: dict[str, uuid.UUID]
    query: dict[str, uuid.UUID]


def user(question: str) -> dict[str, str]:
    return {"role": "user", "content": f"<sources>\n[1] ...\n</sources>\n\nQuestion: {question}"}


def _write(db: Database, tenant: uuid.UUID, collection: str, names: list[str]) -> uuid.UUID:
    with db.write() as session:
        model = store.embedding_models.ensure_model(
            session, name="fake", dimension=4, path=None, hnsw_m=8, hnsw_ef_construction=16
        )
        cid = store.collections.ensure_collection(session, tenant, collection)
        documents = [
            store.documents.DocumentWrite(
                external_id=name,
                title=name.title(),
                source="test",
                metadata={},
                content_hash=name,
                char_count=len(TEXTS[name]),
                chunks=[TextChunk(0, TEXTS[name], 0, len(TEXTS[name]), 10)],
                chunk_hashes=[name],
                embeddings=np.random.default_rng(0).random((1, 4), dtype=np.float32),
            )
            for name in names
        ]
        store.documents.write_documents(
            session, tenant_id=tenant, collection_id=cid, model_id=model.id, documents=documents
        )
    return cid


def _chunk_ids(db: Database) -> dict[str, uuid.UUID]:
    with db.read() as session:
        rows = session.execute(
            text(
                "SELECT d.external_id, c.id FROM chunks c JOIN documents d ON d.id = c.document_id"
            )
        )
        return {name: chunk_id for name, chunk_id in rows}


def _documents_of(db: Database, chunk_ids: list[uuid.UUID]) -> dict[uuid.UUID, uuid.UUID]:
    """chunk id → its document's id (a logged answer naming a missing document is redacted)."""
    with db.read() as session:
        rows = session.execute(
            text("SELECT id, document_id FROM chunks WHERE id = ANY(:ids)"), {"ids": chunk_ids}
        )
        return {chunk_id: document_id for chunk_id, document_id in rows}


def _log(
    db: Database,
    tenant: uuid.UUID,
    collections: list[uuid.UUID],
    question: str,
    answer: str,
    ranked: list[uuid.UUID],
    cited: list[uuid.UUID],
    *,
    messages: bool = True,
    at: datetime,
) -> uuid.UUID:
    documents = _documents_of(db, [*ranked, *cited])
    record = store.query_log.QueryRecord(
        tenant_id=tenant,
        endpoint="query",
        question=question,
        collection_ids=collections,
        params={},
        retrieved=[
            store.query_log.RetrievedChunk(c, documents[c], 1.0 - i / 10)
            for i, c in enumerate(ranked)
        ],
        answer=answer,
        citations=[store.query_log.Citation(1, documents[c], (c,)) for c in cited],
        timings={},
        upstream_model="m",
        status="ok",
        messages=[SYSTEM, user(question)] if messages else None,
    )
    with db.write() as session:
        store.query_log.log_query(session, record)
        session.execute(update(QueryLog).where(QueryLog.id == record.id).values(created_at=at))
    return record.id


def _feedback(
    db: Database, tenant: uuid.UUID, query: uuid.UUID, at: datetime, **given: Any
) -> None:
    with db.write() as session:
        row = store.feedback.add_feedback(
            session,
            store.feedback.NewFeedback(
                query_id=query,
                tenant_id=tenant,
                rating=given.get("rating"),
                scale=given.get("scale", "thumbs"),
                comment=None,
                corrected_answer=given.get("corrected"),
                relevant_chunk_ids=given.get("relevant", []),
                irrelevant_chunk_ids=given.get("irrelevant", []),
            ),
        )
        session.execute(update(Feedback).where(Feedback.id == row.id).values(created_at=at))


T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def day(n: int) -> datetime:
    return T0 + timedelta(days=n)


@pytest.fixture
def seeded(settings: Settings) -> Iterator[Seeded]:
    db = open_database(settings, route_reads=False)
    with db.write() as session:
        acme = store.tenants.ensure_tenant(session, "acme")
        globex = store.tenants.ensure_tenant(session, "globex")
    hr = _write(db, acme, "hr", ["leave", "holidays", "travel", "laptops"])
    ops = _write(db, acme, "ops", ["oncall"])
    globex_hr = _write(db, globex, "hr", ["secret"])
    c = _chunk_ids(db)
    top = [c["leave"], c["holidays"], c["travel"], c["laptops"]]
    q = {
        "good": _log(
            db,
            acme,
            [hr],
            "How long is parental leave?",
            "Sixteen weeks [1].",
            top,
            [c["leave"]],
            at=day(0),
        ),
        "bad": _log(
            db,
            acme,
            [hr],
            "  how long is PARENTAL leave ",
            "Four weeks [1].",
            top,
            [c["leave"]],
            at=day(1),
        ),
        "corrected": _log(
            db,
            acme,
            [hr],
            "When do I get a laptop?",
            "Next month [1].",
            [c["laptops"], c["travel"]],
            [c["laptops"]],
            at=day(2),
        ),
        "replay": _log(
            db,
            acme,
            [hr],
            "How long is parental leave?",
            "Sixteen weeks [1].",
            top,
            [c["leave"]],
            messages=False,
            at=day(3),
        ),
        "ops": _log(
            db,
            acme,
            [ops],
            "Is on-call paid?",
            "Yes, weekly [1].",
            [c["oncall"]],
            [c["oncall"]],
            at=day(4),
        ),
        "changed_mind": _log(
            db,
            acme,
            [hr],
            "Can I book flights?",
            "Yes [1].",
            [c["travel"]],
            [c["travel"]],
            at=day(5),
        ),
        "globex": _log(
            db,
            globex,
            [globex_hr],
            "Is there a bonus?",
            "Yes [1].",
            [c["secret"]],
            [c["secret"]],
            at=day(0),
        ),
    }
    _feedback(
        db, acme, q["good"], day(10), rating=1, relevant=[c["leave"]], irrelevant=[c["travel"]]
    )
    _feedback(db, acme, q["bad"], day(11), rating=-1)
    _feedback(
        db,
        acme,
        q["corrected"],
        day(12),
        rating=2,
        scale="stars",
        corrected="New staff receive a laptop on their first day [1].",
    )
    _feedback(db, acme, q["replay"], day(13), rating=1)
    _feedback(db, acme, q["ops"], day(14), rating=5, scale="stars")
    _feedback(db, acme, q["changed_mind"], day(15), rating=1)
    _feedback(db, acme, q["changed_mind"], day(16), rating=-1)
    _feedback(
        db,
        globex,
        q["globex"],
        day(10),
        rating=1,
        relevant=[c["secret"]],
        corrected="Globex secret answer.",
    )
    try:
        yield Seeded(db, acme, globex, hr, ops, c, q)
    finally:
        db.dispose()


def export(seeded: Seeded, fmt: ExportFormat, **filters: Any) -> list[dict[str, Any]]:
    flt = ExportFilter(tenant_id=filters.pop("tenant_id", seeded.acme), **filters)
    with seeded.db.read() as session:
        return list(records(session, fmt, flt))


def sft(question: str, answer: str) -> dict[str, Any]:
    return {"messages": [SYSTEM, user(question), {"role": "assistant", "content": answer}]}


def test_sft_teaches_corrections_and_well_rated_answers_only(seeded: Seeded) -> None:
    assert export(seeded, ExportFormat.OPENAI_SFT) == [
        sft("How long is parental leave?", "Sixteen weeks [1]."),
        sft("When do I get a laptop?", "New staff receive a laptop on their first day [1]."),
        sft("Is on-call paid?", "Yes, weekly [1]."),
    ]


def test_openai_and_trl_preference_pairs(seeded: Seeded) -> None:
    leave_prompt = [SYSTEM, user("How long is parental leave?")]
    laptop_prompt = [SYSTEM, user("When do I get a laptop?")]
    openai = export(seeded, ExportFormat.OPENAI_DPO)
    assert openai == [
        {
            "input": {"messages": leave_prompt},
            "preferred_output": [{"role": "assistant", "content": "Sixteen weeks [1]."}],
            "non_preferred_output": [{"role": "assistant", "content": "Four weeks [1]."}],
        },
        {
            "input": {"messages": laptop_prompt},
            "preferred_output": [
                {
                    "role": "assistant",
                    "content": "New staff receive a laptop on their first day [1].",
                }
            ],
            "non_preferred_output": [{"role": "assistant", "content": "Next month [1]."}],
        },
    ]
    trl = export(seeded, ExportFormat.TRL_DPO)
    assert [set(r) for r in trl] == [{"prompt", "chosen", "rejected"}] * 2
    assert [r["prompt"] for r in trl] == [o["input"]["messages"] for o in openai]
    assert [r["chosen"] for r in trl] == [o["preferred_output"] for o in openai]
    assert [r["rejected"] for r in trl] == [o["non_preferred_output"] for o in openai]


def test_triplets_pair_relevant_chunks_with_the_hardest_negatives(seeded: Seeded) -> None:
    with seeded.db.read() as session:
        rows = list(triplets(session, ExportFilter(tenant_id=seeded.acme)))
    question = "How long is parental leave?"
    # leave was marked relevant (and cited by a well-rated answer); travel marked irrelevant;
    # holidays and laptops ranked in the top 10 without being marked relevant.
    assert rows == [
        {"anchor": question, "positive": TEXTS["leave"], "negative": TEXTS["holidays"]},
        {"anchor": question, "positive": TEXTS["leave"], "negative": TEXTS["travel"]},
        {"anchor": question, "positive": TEXTS["leave"], "negative": TEXTS["laptops"]},
    ]
    with seeded.db.read() as session:
        one = list(triplets(session, ExportFilter(tenant_id=seeded.acme), negatives_per_positive=1))
    assert [r["negative"] for r in one] == [TEXTS["holidays"]]


def test_triplets_load_as_a_sentence_transformers_dataset(seeded: Seeded, tmp_path: Path) -> None:
    from datasets import Dataset, Value

    path = tmp_path / "triplets.jsonl"
    flt = ExportFilter(tenant_id=seeded.acme)
    path.write_bytes(b"".join(ndjson(seeded.db, ExportFormat.TRIPLETS, flt)))
    from_file = Dataset.from_json(str(path))
    assert from_file.column_names == ["anchor", "positive", "negative"]
    assert all(from_file.features[name] == Value("string") for name in from_file.column_names)
    assert from_file.num_rows == 3
    with seeded.db.read() as session:
        from_list = Dataset.from_list(list(triplets(session, flt)))
    assert from_list.column_names == ["anchor", "positive", "negative"]
    assert from_list[0] == from_file[0]


def questions(rows: list[dict[str, Any]]) -> list[str]:
    return [r["messages"][1]["content"].rsplit("Question: ", 1)[1] for r in rows]


def test_filters_collection_rating_and_time(seeded: Seeded) -> None:
    assert questions(export(seeded, ExportFormat.OPENAI_SFT, collection="ops")) == [
        "Is on-call paid?"
    ]
    assert questions(export(seeded, ExportFormat.OPENAI_SFT, collection_id=seeded.hr)) == [
        "How long is parental leave?",
        "When do I get a laptop?",
    ]
    # The latest rating counts: changed_mind (+1, then -1) is below 0 now.
    assert questions(export(seeded, ExportFormat.OPENAI_SFT, min_rating=3)) == ["Is on-call paid?"]
    assert questions(export(seeded, ExportFormat.OPENAI_SFT, max_rating=2)) == [
        "How long is parental leave?",
        "When do I get a laptop?",
    ]
    # Feedback time: since inclusive, until exclusive.
    window = {"since": day(12), "until": day(14)}
    assert questions(export(seeded, ExportFormat.OPENAI_SFT, **window)) == [
        "When do I get a laptop?"
    ]
    # Query time, naive datetimes read as UTC.
    naive = {"since": day(0).replace(tzinfo=None), "until": day(1).replace(tzinfo=None)}
    assert questions(export(seeded, ExportFormat.OPENAI_SFT, time_of="query", **naive)) == [
        "How long is parental leave?"
    ]
    with pytest.raises(NotFoundError):
        export(seeded, ExportFormat.OPENAI_SFT, collection="nope")
    with pytest.raises(InvalidInputError):
        export(seeded, ExportFormat.OPENAI_SFT, min_rating=4, max_rating=2)


def test_an_export_never_holds_another_tenants_feedback(seeded: Seeded) -> None:
    for fmt in ExportFormat:
        dumped = json.dumps(export(seeded, fmt))
        assert "Globex" not in dumped and "bonus" not in dumped
    assert export(seeded, ExportFormat.OPENAI_SFT, tenant_id=seeded.globex) == [
        sft("Is there a bonus?", "Globex secret answer.")
    ]
    globex = export(seeded, ExportFormat.OPENAI_SFT, tenant_id=seeded.globex, collection="hr")
    assert len(globex) == 1
    assert export(seeded, ExportFormat.OPENAI_SFT, collection="hr")[0] != globex[0]


def test_rows_stream_from_a_server_side_cursor(seeded: Seeded) -> None:
    with seeded.db.read() as session:
        rows = store.feedback.export_rows(
            session, ExportFilter(tenant_id=seeded.acme), batch_size=2
        )
        first = next(rows)
        cursors = session.execute(text("SELECT count(*) FROM pg_cursors")).scalar_one()
        rest = list(rows)
    assert cursors == 1
    assert first.query_id == seeded.query["good"]
    assert [r.query_id for r in rest] == [
        seeded.query[name] for name in ("bad", "corrected", "replay", "ops", "changed_mind")
    ]
    assert [f.rating for f in rest[-1].feedback] == [1, -1]


def test_ndjson_batches_hold_whole_lines(seeded: Seeded) -> None:
    flt = ExportFilter(tenant_id=seeded.acme)
    pieces = list(ndjson(seeded.db, ExportFormat.OPENAI_SFT, flt, batch=2))
    assert [piece.count(b"\n") for piece in pieces] == [2, 1]
    assert all(piece.endswith(b"\n") for piece in pieces)
    lines = b"".join(pieces).decode().splitlines()
    assert [json.loads(line) for line in lines] == export(seeded, ExportFormat.OPENAI_SFT)


def test_feedback_waits_briefly_for_its_answers_log_row(seeded: Seeded) -> None:
    late = uuid.uuid4()
    record = store.query_log.QueryRecord(
        tenant_id=seeded.acme,
        endpoint="query",
        question="late?",
        collection_ids=[seeded.hr],
        params={},
        retrieved=[],
        answer="yes",
        citations=[],
        timings={},
        upstream_model=None,
        status="extractive",
        id=late,
    )

    def write_log() -> None:  # a thread of its own: no tenant until it names one
        with tenancy.as_tenant(seeded.acme), seeded.db.write() as session:
            store.query_log.log_query(session, record)

    timer = threading.Timer(0.3, write_log)
    timer.start()
    try:
        stored = submit_feedback(
            seeded.db, tenant_id=seeded.acme, query_id=late, feedback=FeedbackInput(rating=1)
        )
    finally:
        timer.join()
    assert stored.query_id == late and stored.rating == 1
    with pytest.raises(NotFoundError, match=f"query {uuid.UUID(int=7)} not found"):
        submit_feedback(
            seeded.db,
            tenant_id=seeded.acme,
            query_id=uuid.UUID(int=7),
            feedback=FeedbackInput(rating=1),
            wait_seconds=0.1,
        )


# -- the CLI -------------------------------------------------------------------------------------


def cli(args: list[str], database_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    from typer.testing import CliRunner

    from ragservice.cli import app
    from ragservice.config import get_settings

    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", database_url)
    get_settings.cache_clear()
    try:
        return CliRunner().invoke(app, ["export-feedback", *args])
    finally:
        get_settings.cache_clear()


def test_cli_writes_the_export_atomically_and_counts_it(
    seeded: Seeded, database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out = tmp_path / "sft.jsonl"
    result = cli(
        ["--format", "openai-sft", "--tenant", "acme", "--output", str(out)],
        database_url,
        monkeypatch,
    )
    assert result.exit_code == 0, result.output
    assert "wrote 3 openai-sft records" in result.stderr
    lines = out.read_text().splitlines()
    assert [json.loads(line) for line in lines] == export(seeded, ExportFormat.OPENAI_SFT)

    to_stdout = cli(
        [
            "--format",
            "triplets",
            "--tenant",
            "acme",
            "--since",
            "2026-03-11",
            "--until",
            "2026-03-12T00:00:00+00:00",
        ],
        database_url,
        monkeypatch,
    )
    assert to_stdout.exit_code == 0, to_stdout.output
    # Only the feedback of day 10 is in the window; globex's, on the same day, is not acme's.
    shown = [json.loads(line) for line in to_stdout.stdout.splitlines()]
    assert [r["negative"] for r in shown] == [TEXTS["holidays"], TEXTS["travel"], TEXTS["laptops"]]
    assert "wrote 3 triplets records to stdout" in to_stdout.stderr

    failed = tmp_path / "never.jsonl"
    bad = cli(
        ["--format", "openai-dpo", "--tenant", "acme", "--collection", "nope", "-o", str(failed)],
        database_url,
        monkeypatch,
    )
    assert bad.exit_code == 1
    assert "collection 'nope' not found" in bad.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft.jsonl"]  # no half file either


def test_cli_defaults_to_the_default_tenant_and_refuses_unknown_ones(
    seeded: Seeded, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = uuid.UUID(DEFAULT_TENANT_ID)
    asked = _log(seeded.db, mine, [], "Default?", "Yes.", [], [], at=day(0))
    _feedback(seeded.db, mine, asked, day(1), rating=1)
    default = cli(["--format", "openai-sft"], database_url, monkeypatch)
    assert default.exit_code == 0, default.output
    assert [json.loads(line) for line in default.stdout.splitlines()] == [sft("Default?", "Yes.")]
    assert "wrote 1 openai-sft records" in default.stderr
    unknown = cli(["--format", "openai-sft", "--tenant", "initech"], database_url, monkeypatch)
    assert unknown.exit_code == 1
    assert "no tenant named 'initech'" in unknown.stderr
    bad_date = cli(["--format", "openai-sft", "--since", "March"], database_url, monkeypatch)
    assert bad_date.exit_code == 2
