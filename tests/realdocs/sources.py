"""Where every file of the real-document corpus came from, and a way to get each one again.

Each format folder here (`pdf/`, `html/`, ...) holds files that nobody in this project wrote,
as they ship inside Debian packages or PyPI releases, and a `SOURCES.toml` naming, for each
file, the package, its version, the path inside it, the licence and the SHA-256 of the bytes:

    [[file]]
    name = "booktabs.pdf"                      # the file's name in this folder
    origin = "debian"                          # or "pypi"
    package = "texlive-latex-recommended-doc"
    version = "2022.20230122-3"
    artifact = "python_docx-1.1.2.tar.gz"      # pypi only: the sdist or wheel
    member = "usr/share/doc/.../booktabs.pdf"  # the path inside the package
    licence = "LPPL-1.3c"
    sha256 = "..."
    what = "what the file is, and what about it a loader can get wrong"

    python tests/realdocs/sources.py list            # where each file came from
    python tests/realdocs/sources.py check           # every file listed, and unchanged
    python tests/realdocs/sources.py fetch OUT       # download each again into OUT, verified
    python tests/realdocs/sources.py references      # pdftotext's text of the PDFs (poppler-utils)

`fetch` needs the network: `apt-get download` for Debian packages (on a Debian machine with
bookworm in its sources; older versions are on snapshot.debian.org), PyPI's JSON API for
releases. The test suite runs `check` (tests/unit/test_realdocs_sources.py), so a file cannot
be added, changed or left unlisted without its provenance.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
FORMATS = ("pdf", "html", "epub", "mail", "office", "sheets")
# Files in a format folder that are this project's own (not corpus files).
OWN_FILES = frozenset({"SOURCES.toml", "questions.jsonl", "truth.toml", "README.md"})
OWN_FOLDERS = frozenset({"reference"})
_ORIGINS = ("debian", "pypi")


@dataclass(frozen=True)
class Source:
    folder: str
    name: str
    origin: str
    package: str
    version: str
    member: str
    licence: str
    sha256: str
    what: str
    artifact: str = ""

    @property
    def path(self) -> Path:
        return ROOT / self.folder / self.name

    @property
    def relative(self) -> str:
        return f"{self.folder}/{self.name}"


def sources(folders: Sequence[str] = FORMATS) -> list[Source]:
    """Every file listed in the folders' SOURCES.toml, in their order."""
    found: list[Source] = []
    for folder in folders:
        manifest = ROOT / folder / "SOURCES.toml"
        if manifest.exists():
            entries = tomllib.loads(manifest.read_text(encoding="utf-8")).get("file", [])
            found.extend(Source(folder=folder, **entry) for entry in entries)
    return found


def corpus_files(folders: Sequence[str] = FORMATS) -> list[Path]:
    """The corpus files present in the folders (the project's own files left out)."""
    files: list[Path] = []
    for folder in folders:
        base = ROOT / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            relative = path.relative_to(base)
            if path.is_file() and not _own(relative):
                files.append(path)
    return files


def _own(relative: Path) -> bool:
    return relative.parts[0] in OWN_FOLDERS or relative.name in OWN_FILES


def problems(folders: Sequence[str] = FORMATS) -> list[str]:
    """What is wrong with the corpus: files missing, changed, unlisted, listed twice, or
    listed without what `fetch` needs."""
    found: list[str] = []
    listed = sources(folders)
    names = [source.relative for source in listed]
    found += [f"{name}: listed twice" for name in sorted({n for n in names if names.count(n) > 1})]
    for source in listed:
        if source.origin not in _ORIGINS:
            found.append(f"{source.relative}: origin must be one of {_ORIGINS}")
        if source.origin == "pypi" and not source.artifact:
            found.append(f"{source.relative}: a PyPI file names its artifact")
        if not source.licence or not source.member or not source.what:
            found.append(f"{source.relative}: licence, member and what are required")
        if not source.path.is_file():
            found.append(f"{source.relative}: listed but missing")
        elif _sha256(source.path.read_bytes()) != source.sha256:
            found.append(f"{source.relative}: its bytes differ from the recorded SHA-256")
    known = {source.path for source in listed}
    for path in corpus_files(folders):
        if path not in known:
            found.append(f"{path.relative_to(ROOT)}: not listed in its SOURCES.toml")
    return found


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- fetching again ----------------------------------------------------------------------------


def fetch(out: Path, only: Sequence[str] = ()) -> Iterator[str]:
    """Download every listed file again (or those named in `only`) into `out`/<folder>/,
    verified against its SHA-256; yields a line per file."""
    wanted = [s for s in sources() if not only or s.relative in only or s.name in only]
    with tempfile.TemporaryDirectory(prefix="realdocs-") as scratch:
        cache: dict[tuple[str, str, str, str], Path] = {}
        for source in wanted:
            key = (source.origin, source.package, source.version, source.artifact)
            if key not in cache:
                cache[key] = _download(source, Path(scratch))
            data = _member(cache[key], source)
            if _sha256(data) != source.sha256:
                raise SystemExit(f"{source.relative}: the fetched bytes differ from the record")
            target = out / source.folder / source.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            yield f"{source.relative}: {source.origin} {source.package} {source.version} ok"


def _download(source: Source, scratch: Path) -> Path:
    if source.origin == "debian":
        folder = scratch / f"{source.package}-{source.version}"
        folder.mkdir()
        spec = f"{source.package}={source.version}"
        subprocess.run(["apt-get", "download", spec], cwd=folder, check=True)
        return next(folder.glob("*.deb"))
    files = _release_files(source.package, source.version)
    match = [f for f in files if f["filename"] == source.artifact]
    if not match:
        raise SystemExit(f"{source.relative}: {source.artifact} is not in the PyPI release")
    target = scratch / source.artifact
    with urllib.request.urlopen(match[0]["url"], timeout=120) as response:
        target.write_bytes(response.read())
    return target


def _release_files(package: str, version: str) -> list[dict[str, Any]]:
    """The files of a PyPI release: from the release's JSON, else from the project's (some
    mirrors serve only the latter)."""
    try:
        with urllib.request.urlopen(f"https://pypi.org/pypi/{package}/{version}/json") as found:
            return list(json.load(found)["urls"])
    except urllib.error.HTTPError:
        with urllib.request.urlopen(f"https://pypi.org/pypi/{package}/json", timeout=60) as found:
            return list(json.load(found)["releases"].get(version, []))


def _member(archive: Path, source: Source) -> bytes:
    """The member's bytes from a .deb (an ar archive holding data.tar.*), an sdist (.tar.gz)
    or a wheel (.whl, a zip)."""
    if archive.suffix == ".deb":
        return _tar_member(_deb_data(archive.read_bytes()), source.member)
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as zipped:
            return zipped.read(source.member)
    return _tar_member(archive.read_bytes(), source.member)


def _deb_data(deb: bytes) -> bytes:
    """The data.tar.* member of a Debian package (ar format: 60-byte headers)."""
    if not deb.startswith(b"!<arch>\n"):
        raise SystemExit("not a Debian package")
    at = 8
    while at < len(deb):
        header = deb[at : at + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        if name.startswith("data.tar"):
            return deb[at + 60 : at + 60 + size]
        at += 60 + size + (size % 2)
    raise SystemExit("the package has no data.tar")


def _tar_member(data: bytes, member: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for entry in tar:
            if entry.name.lstrip("./") == member.lstrip("./") and entry.isfile():
                extracted = tar.extractfile(entry)
                if extracted is not None:
                    return extracted.read()
    raise SystemExit(f"{member} is not in the archive")


# -- reference texts ---------------------------------------------------------------------------


def write_references() -> Iterator[str]:
    """pdftotext's `-layout` text of every PDF (the words kept in their physical places, one
    form feed after each page) into pdf/reference/<name>.layout.txt."""
    pdftotext = shutil.which("pdftotext")
    if pdftotext is None:
        raise SystemExit("pdftotext is not installed (Debian's poppler-utils)")
    version = subprocess.run([pdftotext, "-v"], capture_output=True, text=True).stderr
    reference = ROOT / "pdf" / "reference"
    reference.mkdir(exist_ok=True)
    (reference / "VERSION").write_text(version.splitlines()[0] + "\n", encoding="utf-8")
    for source in sources(("pdf",)):
        target = reference / f"{source.path.stem}.layout.txt"
        run = [pdftotext, "-layout", "-enc", "UTF-8", str(source.path), str(target)]
        subprocess.run(run, check=True)
        yield f"{source.relative}: reference texts written"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="where each file came from")
    commands.add_parser("check", help="every file listed, present and unchanged")
    fetching = commands.add_parser("fetch", help="download the files again, verified")
    fetching.add_argument("out", type=Path)
    fetching.add_argument("--only", nargs="*", default=[], help="names or folder/names")
    commands.add_parser("references", help="write pdftotext's texts of the PDFs")
    args = parser.parse_args(argv)
    if args.command == "list":
        for s in sources():
            where = f"{s.package} {s.version}" + (f" ({s.artifact})" if s.artifact else "")
            print(f"{s.relative}\t{s.origin}\t{where}\t{s.member}\t{s.licence}")
    elif args.command == "check":
        found = problems()
        print("\n".join(found) or f"{len(sources())} files, all listed and unchanged")
        return 1 if found else 0
    elif args.command == "fetch":
        for line in fetch(args.out, args.only):
            print(line, flush=True)
    else:
        for line in write_references():
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
