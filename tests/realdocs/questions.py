"""The questions a user would ask of the real-document corpus, and how an answer is judged.

Each format folder's `questions.jsonl` holds one question a line: its `id`, the `question`, the
`file` that answers it (its external id when the corpus folder is ingested whole: the path
under tests/realdocs, an e-mail attachment under its message's), and where in it the answer
lies, if the document has places: `page` (a PDF's page) or `slide` (a deck's), either a list
where several places answer alike; `sheet` (a workbook's sheet, by name) and `rows` (the
first and last spreadsheet row). `answer` is what a reader finds there; `also` lists other
files that answer alike (a message the corpus holds twice, a forwarded message inside its
envelope). A citation is right when it names the file (or one of `also`) and the place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tests.realdocs.sources import FORMATS, ROOT

# What `ragservice ingest tests/realdocs` must leave out: the project's own files.
NOT_CORPUS = ("**/reference/**", "fidelity/**", "*.jsonl", "*.toml", "*.py", "*.md")


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    file: str
    place: dict[str, Any] = field(default_factory=dict)
    also: tuple[str, ...] = ()
    answer: str = ""

    @property
    def format(self) -> str:
        return self.id.split("-", 1)[0]


def questions() -> list[Question]:
    found: list[Question] = []
    for folder in FORMATS:
        path = ROOT / folder / "questions.jsonl"
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                item = json.loads(line)
                place = {k: item[k] for k in ("page", "slide", "sheet", "rows") if k in item}
                also = tuple(item.get("also", ()))
                question = Question(item["id"], item["question"], item["file"], place, also)
                found.append(replace(question, answer=str(item.get("answer", ""))))
    return found


@dataclass(frozen=True)
class Verdict:
    file: bool
    place: bool

    @property
    def right(self) -> bool:
        return self.file and self.place


def judge(question: Question, citation: Mapping[str, Any] | None) -> Verdict:
    """Whether the first citation of an answer (the API's JSON) names the question's file,
    and the place where the answer lies (its pages include the page or slide; it names the
    sheet; its rows include the rows)."""
    if citation is None:
        return Verdict(False, False)
    right_file = citation["document"]["external_id"] in (question.file, *question.also)
    pages = set(citation.get("pages") or [])
    cited_as = str(citation.get("cited_as", ""))
    place = question.place
    right_place = True
    if "page" in place:
        right_place = bool(pages & _numbers(place["page"])) and "slide" not in cited_as
    if "slide" in place:
        right_place = bool(pages & _numbers(place["slide"])) and "slide" in cited_as
    if "sheet" in place:
        right_place = f'sheet "{place["sheet"]}"' in cited_as
    return Verdict(right_file, right_file and right_place)


def _numbers(place: int | list[int]) -> set[int]:
    return set(place) if isinstance(place, list) else {place}
