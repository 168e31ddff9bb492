"""Pure parts of the bulk import: column specs, vector checks, offsets and content hashes."""

from __future__ import annotations

import numpy as np
import pytest

from ingest.loaders import JsonlFields, ParquetColumns
from ingest.loaders.parsing import ParseError
from ingest.loaders.vectors import vector_matrix
from ingest.pipeline import document_hash, imported_chunks
from ragservice.types import LoadedDocument, PrecomputedChunks


def test_parquet_columns_parse() -> None:
    columns = ParquetColumns.parse("id=doc, embedding=vec")
    assert (columns.id, columns.embedding, columns.text) == ("doc", "vec", "text")


@pytest.mark.parametrize(
    ("spec", "message"),
    [("", "empty"), ("id", "not key=value"), ("colour=red", "unknown key"), ("id=a,id=b", "twice")],
)
def test_parquet_columns_parse_refuses_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ParquetColumns.parse(spec)


def test_jsonl_fields_name_the_chunks_key() -> None:
    assert JsonlFields.parse("chunks=passages").chunks == "passages"
    assert JsonlFields().chunks == "chunks"


def test_vector_matrix_checks_shape_type_and_finiteness() -> None:
    matrix = vector_matrix([[1, 2], [3.5, 4]])
    assert matrix.dtype == np.float32 and matrix.shape == (2, 2)
    with pytest.raises(ParseError, match="not finite"):
        vector_matrix([[1.0, 2.0], [1e39, 0.0]])  # beyond float32's range
    with pytest.raises(ParseError, match="array of numbers"):
        vector_matrix([[True, None]])


def _doc(
    vectors: list[list[float]], texts: tuple[str, ...] = ("one two", "three")
) -> LoadedDocument:
    pre = PrecomputedChunks(
        texts=texts,
        metadata=({}, {"k": 1}),
        vectors=np.asarray(vectors, dtype=np.float32),
        where="f.jsonl:1",
    )
    return LoadedDocument(external_id="d", text="\n\n".join(texts), precomputed=pre)


def test_imported_chunks_have_offsets_into_the_joined_text_and_word_counts() -> None:
    doc = _doc([[1.0, 0.0], [0.0, 1.0]])
    assert doc.precomputed is not None
    chunks = imported_chunks(doc.precomputed)
    assert [doc.text[c.start_char : c.end_char] for c in chunks] == ["one two", "three"]
    assert [(c.ordinal, c.token_count, c.metadata) for c in chunks] == [
        (0, 2, {}),
        (1, 1, {"k": 1}),
    ]


def test_document_hash_covers_vectors_and_model() -> None:
    base = _doc([[1.0, 0.0], [0.0, 1.0]])
    assert document_hash(base, 1) == document_hash(_doc([[1.0, 0.0], [0.0, 1.0]]), 1)
    assert document_hash(base, 1) != document_hash(_doc([[1.0, 0.0], [0.0, 0.5]]), 1)
    assert document_hash(base, 1) != document_hash(base, 2)
    plain = LoadedDocument(external_id="d", text=base.text)
    assert document_hash(plain, 1) == document_hash(plain, 2) != document_hash(base, 1)
