"""Words compared as a reader compares them: the measures every format's fidelity uses.

Texts are compared as multisets of words: NFKC (ligatures such as "ﬁ" become "fi"),
case-folded, runs of letters and digits. Punctuation, Markdown (`#`, `|`, `---`) and
whitespace are no words, so a table or a heading costs nothing, and a word glued to its
neighbour is a miss. A word the reference breaks with a hyphen at a line's end ("sub-" and
"mitted", two of its words) and the other text writes whole ("submitted") is a match of both:
`word_score` pairs them after the plain matching (a reference laid out in columns cannot be
joined by reading: the word's second half is on the next line of its column, not next).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_WORD = re.compile(r"[^\W_]+")
# pdfium's marks of a hyphen that breaks a word at a line's end (U+0002; U+FFFE in its text)
_HYPHEN_MARKS = str.maketrans({"\x02": "-", "\ufffe": "-"})
_MIN_HALF = 2  # letters of each half of a broken word
_LETTERS = re.compile(r"[^\W\d_]+")
GLUED_LETTERS = 25
"""A run of this many letters with no space is two or more words glued together (English
words this long are rare; the reference is asked whether it has the run too)."""


def normalise(text: str) -> str:
    return unicodedata.normalize("NFKC", text.translate(_HYPHEN_MARKS)).casefold()


def words(text: str) -> list[str]:
    return _WORD.findall(normalise(text))


@dataclass(frozen=True)
class WordScore:
    """Words of ours found in the reference (`matched`), out of ours, out of the reference's;
    and the reference's words found in ours, where that differs (a word ours writes whole
    matches two halves of the reference's)."""

    matched: int
    ours: int
    reference: int
    reference_matched: int | None = None

    @property
    def found(self) -> int:
        """The reference's words found in ours."""
        return self.matched if self.reference_matched is None else self.reference_matched

    @property
    def recall(self) -> float:
        return self.found / self.reference if self.reference else 1.0

    @property
    def precision(self) -> float:
        return self.matched / self.ours if self.ours else 1.0

    def __add__(self, other: WordScore) -> WordScore:
        return WordScore(
            self.matched + other.matched,
            self.ours + other.ours,
            self.reference + other.reference,
            self.found + other.found,
        )


NO_WORDS = WordScore(0, 0, 0)


def word_score(ours: Iterable[str], reference: Iterable[str]) -> WordScore:
    """Multiset overlap of two word lists (`words`), then each word left over in `ours` that
    is two words left over in the reference glued (a hyphenated line break) matched to both."""
    mine, theirs = Counter(ours), Counter(reference)
    common = mine & theirs
    left_mine, left_theirs = mine - common, theirs - common
    pairs = 0
    for word, count in sorted(left_mine.items()):
        for _ in range(count):
            halves = _halves(word, left_theirs)
            if halves is None:
                break
            left_theirs -= Counter(halves)
            pairs += 1
    matched = sum(common.values())
    return WordScore(matched + pairs, mine.total(), theirs.total(), matched + 2 * pairs)


def _halves(word: str, left: Counter[str]) -> tuple[str, str] | None:
    for cut in range(_MIN_HALF, len(word) - _MIN_HALF + 1):
        head, tail = word[:cut], word[cut:]
        if left[head] > 0 and left[tail] > 0 and (head != tail or left[head] > 1):
            return head, tail
    return None


def total(scores: Iterable[WordScore]) -> WordScore:
    return sum(scores, NO_WORDS)


def glued_runs(ours: str, reference: str) -> list[str]:
    """Runs of `GLUED_LETTERS` or more letters in `ours` that the reference does not have."""
    known = set(_LETTERS.findall(normalise(reference)))
    runs = _LETTERS.findall(normalise(ours))
    return [run for run in runs if len(run) >= GLUED_LETTERS and run not in known]


@dataclass(frozen=True)
class Order:
    """Of the reference's sentences of prose (`sentences`, `in_order`): how many there are,
    how many `ours` has exactly once word for word, and how many of those are in the
    reference's order (the longest run of them in increasing position, so one misplaced
    sentence costs one). A sentence ours breaks (another column's words inside it) is lost:
    `score` counts it out of place."""

    sentences: int
    found: int
    in_place: int

    @property
    def score(self) -> float:
        return self.in_place / self.sentences if self.sentences else 1.0

    def __add__(self, other: Order) -> Order:
        return Order(
            self.sentences + other.sentences,
            self.found + other.found,
            self.in_place + other.in_place,
        )


def is_prose(sentence: str) -> bool:
    """No mathematics in it (math symbols, math alphanumerics, Greek, a math font's unmapped
    glyphs): a formula's glyphs come in another order in every extraction."""
    return not any(
        (unicodedata.category(char) in ("Sm", "Cc") and char not in "\n\t\r")
        or "\u0370" <= char <= "\u03ff"
        or "\U0001d400" <= char <= "\U0001d7ff"
        for char in sentence
    )


def in_order(ours: str, reference: Sequence[str], min_words: int = 6) -> Order:
    """How `ours` keeps the reading order of the `reference` sentences (`Order`): those of
    prose (`is_prose`) of `min_words` words or more that the reference has once (a sentence
    it repeats, even inside another, cannot be placed)."""
    # Letters and digits only, no spaces: a word broken by a hyphen in either text matches.
    text = "".join(words(ours))
    needles = [
        "".join(found) for s in reference if is_prose(s) and len(found := words(s)) >= min_words
    ]
    whole = "".join(words(" ".join(reference)))
    positions: list[int] = []
    count = 0
    for needle in needles:
        if whole.count(needle) > 1:
            continue
        count += 1
        at = text.find(needle)
        if at >= 0 and text.find(needle, at + 1) < 0:
            positions.append(at)
    return Order(count, len(positions), _longest_increasing(positions))


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
    """The text cut after `.`, `!` or `?` followed by a capital, and at blank lines."""
    return [
        part
        for block in re.split(r"\n\s*\n", text)
        for part in _SENTENCE_END.split(" ".join(block.split()))
        if part
    ]
