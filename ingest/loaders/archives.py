"""Zip archives (DOCX, PPTX, XLSX, ODT, EPUB): zip bombs are refused before a library opens them.

An office file is a zip archive of XML. A small file can declare members that unpack to
gigabytes, and the libraries that read these formats unpack whole members into memory, so the
declared sizes are checked first. zipfile never reads past a member's declared size, so checking
the declared sizes suffices.
"""

from __future__ import annotations

import io
import zipfile

from ingest.loaders.cleaning import clean_text
from ingest.loaders.parsing import ParseError

MAX_MEMBERS = 10_000
MAX_UNPACKED = 256 * 2**20
MAX_RATIO = 200  # Deflate reaches about 1000:1 on zip bombs; XML rarely passes 20:1
RATIO_FROM = 2**20  # small members may compress however well they like
# The whole archive against the file's size, since many small members escape the check above
# (256 one-MiB members of zeros make 256 MiB from a 300 KB file). Ordinary office XML packs 5 to
# 20:1 (python-docx's own template, mostly styles, 23:1), images and fonts about 1:1, so a real
# file stays far below 100:1, while deflate gives a bomb about 1000:1. At 100:1, unpacking the
# 256 MiB allowed above takes a file of 2.5 MiB or more; up to 1 MiB unpacks from any size.
MAX_TOTAL_RATIO = 100


def open_archive(data: bytes, kind: str) -> zipfile.ZipFile:
    """The zip archive in `data`, checked (`check_archive`); `kind` names the format in the
    refusal ("DOCX"). zipfile's own errors (not a zip file) are the caller's to report."""
    archive = zipfile.ZipFile(io.BytesIO(data))
    check_archive(archive, len(data), kind)
    return archive


def check_archive(archive: zipfile.ZipFile, size: int, kind: str = "archive") -> None:
    """Refuse an archive of `size` bytes that would unpack into far more than a document."""
    members = archive.infolist()
    if len(members) > MAX_MEMBERS:
        raise ParseError(f"refused: the archive has {len(members)} members (a zip bomb?)")
    unpacked = sum(member.file_size for member in members)
    if unpacked > MAX_UNPACKED:
        raise ParseError(f"refused: the archive unpacks to {unpacked} bytes (a zip bomb?)")
    for member in members:
        ratio = member.file_size / max(member.compress_size, 1)
        if member.file_size > RATIO_FROM and ratio > MAX_RATIO:
            raise ParseError(
                f"refused: {clean_text(member.filename)[:100]!r} is compressed {ratio:.0f}:1 "
                "(a zip bomb?)"
            )
    if unpacked > max(RATIO_FROM, MAX_TOTAL_RATIO * size):
        raise ParseError(
            f"refused: the {kind} unpacks to {unpacked / 2**20:.1f} MiB, more than "
            f"{MAX_TOTAL_RATIO} times its size (a zip bomb?)"
        )
