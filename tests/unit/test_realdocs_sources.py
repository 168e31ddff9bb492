"""The real-document corpus (tests/realdocs) keeps its provenance: every file listed with its
package, version, licence and hash, and no file unlisted."""

from __future__ import annotations

from tests.realdocs import sources


def test_every_corpus_file_is_listed_unchanged_with_its_licence() -> None:
    assert sources.problems() == []
    assert len(sources.sources()) == len(sources.corpus_files())


def test_an_unlisted_file_is_named(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "pdf"
    folder.mkdir()
    (folder / "stray.pdf").write_bytes(b"%PDF-1.4")
    (folder / "SOURCES.toml").write_text("")
    monkeypatch.setattr(sources, "ROOT", tmp_path)
    assert sources.problems(("pdf",)) == ["pdf/stray.pdf: not listed in its SOURCES.toml"]


def test_a_changed_file_is_named(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "pdf"
    folder.mkdir()
    (folder / "a.pdf").write_bytes(b"changed")
    (folder / "SOURCES.toml").write_text(
        '[[file]]\nname = "a.pdf"\norigin = "debian"\npackage = "p"\nversion = "1"\n'
        'member = "usr/a.pdf"\nlicence = "MIT"\nsha256 = "00"\nwhat = "a file"\n'
    )
    monkeypatch.setattr(sources, "ROOT", tmp_path)
    assert sources.problems(("pdf",)) == ["pdf/a.pdf: its bytes differ from the recorded SHA-256"]
