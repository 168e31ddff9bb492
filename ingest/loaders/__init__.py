"""Loaders: turn files, folders and JSONL exports into `LoadedDocument`s.

Bad content never raises. A file (or JSONL line) that cannot be parsed becomes a `LoadFailure`
with a short reason, so one broken file does not stop a batch; a file not read on purpose (a
type no loader reads, in a folder or attached to a message) becomes a `SkippedFile`, so that
it is counted and listed, not lost without a word. Every text, title and string metadata
value passes through `clean_text`: PostgreSQL rejects NUL bytes and invalid UTF-8, and one
such value would fail a whole COPY batch.

One module per format (`text_files`, `html_files`, `docx_files`, `pptx_files`, `xlsx_files`,
`csv_files`, `odt_files`, `rtf_files`, `epub_files`, `email_files`, `mbox_files`,
`image_files`, `jsonl_files`, `parquet_files`) and a folder for PDF (`pdf`); `formats` lists
the formats (suffixes, MIME types, citations, extras, limits), `loading` picks the format by
suffix, `walking` selects files under folders, `cleaning` makes text safe to
store; `ragservice.limits.documents` bounds each document. Formats parse in a child process
(`sandbox`), whose replies `replies` checks; zip-based formats pass `archives`' zip-bomb
check first, and structured ones build their Markdown with `markdown_text`. `tables` writes
the Markdown tables of PDFs and DOCX; `ocr` reads scans and images with tesseract.
"""

from ingest.loaders.cleaning import clean_text, decode_bytes
from ingest.loaders.formats import FORMATS, SUPPORTED_SUFFIXES, Format, file_type
from ingest.loaders.jsonl_files import JsonlFields
from ingest.loaders.loading import load_bytes, load_documents, load_file, load_text, upload_name
from ingest.loaders.parquet_files import ParquetColumns
from ingest.loaders.parsing import LoadResult
from ingest.loaders.walking import iter_files
from ragservice.limits.documents import NO_TEXT, DocumentLimits

__all__ = [
    "FORMATS",
    "NO_TEXT",
    "SUPPORTED_SUFFIXES",
    "DocumentLimits",
    "Format",
    "JsonlFields",
    "LoadResult",
    "ParquetColumns",
    "clean_text",
    "decode_bytes",
    "file_type",
    "iter_files",
    "load_bytes",
    "load_documents",
    "load_file",
    "load_text",
    "upload_name",
]
