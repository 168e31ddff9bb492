"""PDF: each page's text in reading order, tables as Markdown tables, code as code blocks.

`document` parses a file (`parse_pdf`); `words` reads a page's words with pdfium, `rules` the
lines it draws and the ruled tables they make; `layout` puts a page's words in reading order
as pieces, with `blocks` (words, lines, tables, code), `columns` (two-column pages) and
`tables` (tables without rules); `text` reads the pages' pieces as one document (running
headers and footers, hyphenation, Markdown escaping).
"""

from ingest.loaders.pdf.document import page_starts, parse_pdf

__all__ = ["page_starts", "parse_pdf"]
