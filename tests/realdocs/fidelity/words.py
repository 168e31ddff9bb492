"""Words compared as a reader compares them: the measures every format's fidelity uses.

Texts are compared as multisets of words: NFKC (ligatures such as "ﬁ" become "fi"),
case-folded, a word broken over two lines by a hyphen ("sub-\\nmitted") joined in both texts,
then runs of letters and digits. Punctuation, Markdown (`#`, `|`, `---`) and whitespace are no
words, so a table or a heading costs nothing, and a word glued to its neighbour is a miss.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

_WORD = re.compile(r"[^\W_]+")
_LINE_HYPHEN = re.compile(r"(?<=[^\W\d_])-[ \t]*\n[ \t]*(?=[^\W\d_])")
_LETTERS = re.compile(r"[^\W\d_]+")
GLUED_LETTERS = 25
"""A run of this many letters with no space is two or more words glued together (English
words this long are rare; the reference is asked whether it has the run too)."""


def normalise(text: str) -> str:
    return _LINE_HYPHEN.sub("", unicodedata.normalize("NFKC", text)).casefold()


def words(text: str) -> list[str]:
    return _WORD.findall(normalise(text))


@dataclass(frozen=True)
class WordScore:
    """Words of ours found in the reference (matched), out of ours and of the reference's."""

    matched: int
    ours: int
    reference: int

    @property
    def recall(self) -> float:
        return self.matched / self.reference if self.reference else 1.0

    @property
    def precision(self) -> float:
        return self.matched / self.ours if self.ours else 1.0

    def __add__(self, other: WordScore) -> WordScore:
        return WordScore(
            self.matched + other.matched, self.ours + other.ours, self.reference + other.reference
        )


def word_score(ours: Iterable[str], reference: Iterable[str]) -> WordScore:
    """Multiset overlap of two word lists (`words`)."""
    mine, theirs = Counter(ours), Counter(reference)
    return WordScore(sum((mine & theirs).values()), sum(mine.values()), sum(theirs.values()))


def total(scores: Iterable[WordScore]) -> WordScore:
    return sum(scores, WordScore(0, 0, 0))


def glued_runs(ours: str, reference: str) -> list[str]:
    """Runs of `GLUED_LETTERS` or more letters in `ours` that the reference does not have."""
    known = set(_LETTERS.findall(normalise(reference)))
    runs = _LETTERS.findall(normalise(ours))
    return [run for run in runs if len(run) >= GLUED_LETTERS and run not in known]


def in_order(ours: str, sentences: Iterable[str], min_words: int = 6) -> tuple[int, int]:
    """How many of the reference's `sentences` (of at least `min_words` words) are found
    exactly once in `ours`, word for word, and how many of those are in the reference's order
    (the longest run of them in increasing position, so one misplaced sentence costs one)."""
    text = f" {' '.join(words(ours))} "
    positions: list[int] = []
    for sentence in sentences:
        found = words(sentence)
        if len(found) < min_words:
            continue
        needle = f" {' '.join(found)} "
        at = text.find(needle)
        if at >= 0 and text.find(needle, at + 1) < 0:
            positions.append(at)
    return len(positions), _longest_increasing(positions)


def _longest_increasing(values: list[int]) -> int:
    import bisect

    tails: list[int] = []
    for value in values:
        index = bisect.bisect_left(tails, value)
        if index == len(tails):
            tails.append(value)
        else:
            tails[index] = value
    return len(tails)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\u201c])")


def sentences(text: str) -> list[str]:
    """The text cut after `.`, `!` or `?` followed by a capital (whitespace collapsed)."""
    flat = " ".join(_LINE_HYPHEN.sub("", text).split())
    return [part for part in _SENTENCE_END.split(flat) if part]
