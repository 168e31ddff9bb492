"""How faithfully a reader gives the text of the real-document corpus, one module per format
(`pdf`, `html`, `epub`, `mail`, `office`); `words` holds the measures they share. Each format's
module runs as a script (`python -m tests.realdocs.fidelity.html`), printing a JSON line per
file and a summary line (`print_rows`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def print_rows(rows: Iterable[Mapping[str, Any]], summary: Mapping[str, Any]) -> None:
    for row in rows:
        print(json.dumps(row, ensure_ascii=False))
    print(json.dumps({"summary": summary}))
