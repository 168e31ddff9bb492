"""A decompression bomb: a PNG of a few kilobytes that declares 20000 x 20000 pixels. `ragservice
ingest` refuses it by the size its header declares, before a pixel is decoded, as a per-file
error that says so; the folder's other files are ingested and the parser process lives on."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ingest.loaders.ocr import MAX_IMAGE_PIXELS
from ingest.loaders.parsing import ParseError
from ingest.loaders.sandbox import parse_isolated, sandbox_pid
from ragservice.cli import app
from ragservice.limits.documents import DocumentLimits

pytestmark = pytest.mark.default_tenancy  # the commands say whose rows they work on


def bomb_png(width: int, height: int) -> bytes:
    """A valid PNG of one colour (1-bit grey, all black): its rows of zeros compress about
    1000:1, so the file is tiny and decoding it would take `width * height` bytes."""
    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte, then the packed pixels
    packer = zlib.compressobj(9)
    data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")
    )


def test_a_decompression_bomb_is_refused_by_its_declared_size(
    cli: CliRunner, tmp_path: Path
) -> None:
    folder = tmp_path / "scans"
    folder.mkdir()
    bomb = bomb_png(20_000, 20_000)
    assert len(bomb) < 100_000
    (folder / "bomb.png").write_bytes(bomb)
    (folder / "notes.txt").write_text("Pumps move water with an impeller.")

    result = cli.invoke(app, ["ingest", str(folder), "-c", "scans", "--json"])
    assert result.exit_code == 1, result.output  # a file failed; the run did not crash
    report = json.loads(result.stdout)
    assert report["failures"] == [
        {
            "source": str(folder / "bomb.png"),
            "error": (
                f"image too large (20000 x 20000 pixels, at most {MAX_IMAGE_PIXELS:,}): "
                "refused before decoding"
            ),
        }
    ]
    assert report["counts"]["failed"] == 1
    assert report["counts"]["new"] == 1, report["counts"]

    again = json.loads(cli.invoke(app, ["ingest", str(folder), "-c", "scans", "--json"]).stdout)
    assert (again["counts"]["unchanged"], again["counts"]["failed"]) == (1, 1)


def test_the_parser_process_refuses_a_bomb_and_lives_on() -> None:
    limits = DocumentLimits(max_pages=100, max_chars=100_000)
    with pytest.raises(ParseError, match=r"image too large \(20000 x 20000 pixels"):
        parse_isolated(".png", bomb_png(20_000, 20_000), limits)
    pid = sandbox_pid()
    assert parse_isolated(".txt", b"still here", limits).text == "still here"
    assert sandbox_pid() == pid
