"""Prompt text for the semantic cache: the normalized key and the meaning guard.

`normalize_prompt` maps prompts that differ only in case, spacing, punctuation, quote style, a
filler phrase ("Is it true that …?") or a request framing ("Can you tell me whether …",
"… please"; `framing.py`) to one string, so they share a `prompt_hash`.

`meaning_differs` runs after a nearest-neighbour match: embeddings score "X increases Y" and
"X does not increase Y" as near-identical, so the cache refuses a match whose critical tokens
(negation, numbers, direction, entities, primes) or content words differ. It is deliberately
conservative: a refused match costs one model call, a wrong one serves a wrong answer.

Pure functions over strings: no database, no models, a few dozen microseconds a call.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable

from ragservice.cache.framing import strip_framing

__all__ = ["MAX_CONTENT_DIFF", "meaning_differs", "normalize_prompt", "prompt_hash"]

# Content words one prompt may have that the other lacks (counted over both sides). One lets
# "X significantly increases Y" serve "X increases Y"; two would let a single substituted word
# ("Albendazole treats …" / "Ivermectin treats …") through.
MAX_CONTENT_DIFF = 1

_QUOTES = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201b": "'",
        "\u2032": "'",
        "\u00b4": "'",
        "`": "'",
        "\u02b9": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u2033": '"',
        "\u2010": "-",
        "\u2011": "-",
        "\u2012": "-",
        "\u2013": "-",
        "\u2014": "-",
        "\u2015": "-",
        "\u2212": "-",
    }
)

# Greek letters spelled out, so "TNF-" + alpha keys alike in either spelling (after casefolding).
_GREEK = str.maketrans(
    {chr(c): unicodedata.name(chr(c)).split()[-1].lower() for c in range(0x3B1, 0x3CA)}
)

_PREFIX = re.compile(
    r"^\s*(?:is\s+it\s+(?:true|the\s+case|correct|a\s+fact)\s+that"
    r"|(?:do\s+you\s+know|can\s+you\s+(?:tell\s+me|confirm))\s+(?:whether|if)"
    r"|true\s+or\s+false\s*[:?-]|(?:claim|question|fact[\s-]*check|verify)\s*:)\s*",
    re.IGNORECASE,
)
# The filler suffix is found from the end of the text (`_suffix_start`), not by a regex search:
# a pattern that starts and ends with `\s*` backtracks quadratically through long whitespace.
# Its words, each matched case-insensitively where the grammar puts it:
_SUFFIX_VERDICT = re.compile(r"true|right|correct", re.IGNORECASE)
_SUFFIX_SUBJECT = re.compile(r"that|it|this", re.IGNORECASE)
_SUFFIX_WORD = {word: re.compile(word, re.IGNORECASE) for word in ("is", "true", "or", "false")}
_SUFFIX_SEPARATORS = "-,:;("
# SciFact writes "CTLA - 4" and "G - quadruplex"; glue so they key like "CTLA-4".
_SPACED_HYPHEN = re.compile(r"(?<=\w) - (?=\w)")
_SPACE = re.compile(r"\s+")


def normalize_prompt(text: str) -> str:
    """The cache key text: case, spacing, quotes, punctuation and filler phrases removed."""
    return _fold(_clean(text))


def prompt_hash(normalized: str) -> str:
    """SHA-256 hex of an already normalized prompt."""
    return hashlib.sha256(normalized.encode("utf-8")).hexdigest()


def _fold(text: str) -> str:
    # Casefolding can leave non-NFKC text ("ß" → "ss" is fine, some others are not).
    return unicodedata.normalize("NFKC", text.casefold()).translate(_GREEK)


def _clean(text: str) -> str:
    """Everything in the key except case: kept separate so entity detection can see case."""
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    text = _strip_fillers(_SPACE.sub(" ", text).strip())
    text = _SPACED_HYPHEN.sub("-", text)
    return _SPACE.sub(" ", _strip_punctuation(text)).strip()


def _strip_fillers(text: str) -> str:
    # "Claim: is it true that X?" stacks two; "Hey, can you tell me: is it true that X? Thanks!"
    # three.
    for _ in range(4):
        stripped = strip_framing(text)
        stripped = _PREFIX.sub("", stripped, count=1)
        stripped = stripped[: _suffix_start(stripped)]
        stripped = strip_framing(stripped.rstrip())
        if stripped == text:
            break
        text = stripped
    return text


def _suffix_start(text: str) -> int | None:
    """Where a filler suffix ending the text starts (None when there is none), in one pass.

    The suffix, case-insensitive, with S for whitespace:
    `S* [-,:;(] S* (true|right|correct|true S+ or S+ false) TAIL` or
    `S+ (is S+ (that|it|this) S+ (true|right|correct) | true S+ or S+ false) TAIL`,
    with `TAIL = S* )? S* ?+ S*` up to the end. Bare "true?" only after a separator, so
    "The opposite is true?" keeps its last word. Where several readings fit, the one that
    starts first wins (as the leftmost match of a regex would), taking in all the whitespace
    before it.
    """
    end = _space_start(text, len(text))
    marks = len(text[:end].rstrip("?"))
    if marks == end:
        return None
    phrase_end = _space_start(text, marks)
    if phrase_end > 0 and text[phrase_end - 1] == ")":
        phrase_end = _space_start(text, phrase_end - 1)
    verdict = _word_before(text, phrase_end, _SUFFIX_VERDICT, (4, 5, 7))
    subject = _spaced_word_before(text, verdict, _SUFFIX_SUBJECT, (2, 4))
    is_that = _spaced_word_before(text, subject, _SUFFIX_WORD["is"], (2,))
    either = _word_before(text, phrase_end, _SUFFIX_WORD["false"], (5,))
    for word in ("or", "true"):
        either = _spaced_word_before(text, either, _SUFFIX_WORD[word], (len(word),))
    starts = []
    for phrase in (verdict, either):  # may follow a separator
        separator = None if phrase is None else _space_start(text, phrase)
        if separator and text[separator - 1] in _SUFFIX_SEPARATORS:
            starts.append(_space_start(text, separator - 1))
    for phrase in (is_that, either):  # may follow whitespace
        if phrase is not None and (space := _space_start(text, phrase)) < phrase:
            starts.append(space)
    return min(starts, default=None)


def _space_start(text: str, end: int) -> int:
    """The start of the whitespace run that ends at `end` (`end` itself when there is none)."""
    return len(text[:end].rstrip())


def _word_before(
    text: str, end: int | None, word: re.Pattern[str], lengths: Iterable[int]
) -> int | None:
    """The start of a match of `word` that ends at `end`, if there is one."""
    if end is None:
        return None
    return next((end - n for n in lengths if n <= end and word.fullmatch(text, end - n, end)), None)


def _spaced_word_before(
    text: str, start: int | None, word: re.Pattern[str], lengths: Iterable[int]
) -> int | None:
    """The start of `word` followed by at least one whitespace character and then `start`."""
    if start is None:
        return None
    end = _space_start(text, start)
    return _word_before(text, end, word, lengths) if end < start else None


def _strip_punctuation(text: str) -> str:
    return "".join(_keep(text, i) for i in range(len(text)))


def _keep(text: str, i: int) -> str:
    """The character at `i`, or a space where it is punctuation that carries no meaning."""
    char = text[i]
    if char.isalnum() or char.isspace() or char == "_":
        return char
    before = text[i - 1] if i > 0 else " "
    after = text[i + 1] if i + 1 < len(text) else " "
    if char == ",":  # 1,000 but not a clause break.
        return char if before.isdigit() and after.isdigit() else " "
    if char in "./":  # 2.5, H2A.Z, 1/2000, and/or; never a sentence's full stop.
        return char if before.isalnum() and after.isalnum() else " "
    if char == "-":  # TNF-alpha inside a word; CD8- as a marker suffix; -5 a sign.
        return char if before.isalnum() or (after.isdigit() and before.isspace()) else " "
    if char == "+":  # CD4+, Ca2+; +1 nucleosome.
        return char if before.isalnum() or after.isdigit() else " "
    if char == "'":  # 3' and 5' ends; don't.
        return char if before.isdigit() or (before.isalpha() and after.isalpha()) else " "
    if char == "%":
        return char if before.isdigit() else " "
    if char in "<>=≤≥±~":  # <5% is not 5%, and "x > y" is not "x < y".
        return char
    if char == "#":  # C# is not C.
        return char if before.isalnum() else " "
    return " "


# ---------------------------------------------------------------------------------------------
# The meaning guard.


def _word_set(words: str) -> frozenset[str]:
    return frozenset(words.split())


_NEGATION = _word_set(
    "not no never none nobody nothing neither nor cannot without lack lacks lacking lacked "
    "absent absence fail fails failed failing unable nowhere hardly"
)
_NEGATED_PREFIXES = ("non-", "non", "un", "in", "im", "ir", "il", "dis", "anti")
_NUMBER_WORDS = _word_set(
    "zero one two three four five six seven eight nine ten eleven twelve fifteen twenty thirty "
    "fifty hundred thousand million billion half twice double triple quarter third"
)
_DIRECTION_WORDS = _word_set(
    "increase decrease raise lower low high higher highest lowest more less fewer most least "
    "greater greatest smaller smallest larger largest bigger reduce reduction elevate diminish "
    "enhance impair improve worsen promote suppress inhibit inhibition inhibitor activate "
    "activation activator induce prevent block stimulate accelerate slow slower faster delay "
    "stabilize destabilize upregulate downregulate up down up-regulate down-regulate positive "
    "negative positively negatively beneficial harmful protective protect gain loss rise fall "
    "drop boost attenuate amplify augment exacerbate alleviate encourage discourage facilitate "
    "hinder impede restrict expand shorter longer shorten lengthen better worse best worst above "
    "below over under before after earlier later early late strong weak stronger weaker "
    "resistant resistance sensitive susceptible agonist antagonist deficiency deficient excess "
    "overexpression knockdown knockout deplete depletion accumulate enrich limit benefit risk "
    "rare common associated unrelated correlate"
)
_STOPWORDS = _word_set(
    "a an the of in on at to for with by from into onto as than then that this these those it its "
    "is are was were be been being am do does did done has have had having and or but if so such "
    "there their they them which who whom whose what when where while can could may might will "
    "would shall should must also very really actually just some any each both all"
)
_NUMBER = re.compile(r"^[<>=≤≥±~]?\d[\d.,/]*%?$")
_PRIME = re.compile(r"^\d+'$")
_NOT_CONTRACTION = re.compile(r"n't$")  # the apostrophe-less forms are listed: "important"
_CONTRACTED = _word_set(
    "dont doesnt didnt isnt arent wasnt werent cant wont couldnt wouldnt shouldnt hasnt havent "
    "hadnt aint"
)


def meaning_differs(query: str, cached: str) -> str | None:
    """Why `cached`'s answer may be wrong for `query`, or None when they may share an answer.

    Takes the original prompts. Reasons: "negation", "direction", "entity", "number", "content",
    and "order" when the same words swap roles ("men more than women" / "women more than men").
    """
    left, right = _Parts.of(query), _Parts.of(cached)
    content = _content_difference(left.content, right.content)
    if left.negations != right.negations or _has_negated_pair(content):
        return "negation"
    if left.directions != right.directions:
        return "direction"
    entities = left.entity_keys | right.entity_keys  # entity-like in either prompt
    if _only(left.compounds, entities) != _only(right.compounds, entities):
        return "entity"
    if left.numbers != right.numbers:
        return "number"
    if sum(content.values()) > MAX_CONTENT_DIFF:
        return "content"
    if _shared_order(left.sequence, right.sequence) != _shared_order(right.sequence, left.sequence):
        return "order"
    return None


class _Parts:
    """The tokens of one prompt, sorted into the classes the guard compares."""

    __slots__ = (
        "compounds",
        "content",
        "directions",
        "entity_keys",
        "negations",
        "numbers",
        "sequence",
    )

    def __init__(self, compounds: list[str], entity_keys: set[str]) -> None:
        self.compounds = [_fold(c) for c in compounds]
        self.entity_keys = entity_keys
        self.negations = 0
        self.numbers: Counter[str] = Counter()
        self.directions: Counter[str] = Counter()
        self.content: Counter[str] = Counter()
        self.sequence: list[str] = []  # every compared word but negation cues, in order
        for word in _words(self.compounds):
            self._add(word)

    @classmethod
    def of(cls, text: str) -> _Parts:
        compounds = _clean(text).split()
        # Case only marks an entity when the prompt was not typed all in one case.
        mixed = any(c.islower() for c in text) and any(c.isupper() for c in text)
        keys = {_fold(c) for c in compounds if _entity_like(c, mixed)}
        return cls(compounds, keys)

    def _add(self, word: str) -> None:
        if word not in _STOPWORDS:
            self.sequence.append(_stem(word))
        if word in _NEGATION or word in _CONTRACTED or _NOT_CONTRACTION.search(word):
            self.negations += 1
        elif _NUMBER.match(word) or word in _NUMBER_WORDS:
            self.numbers[word.replace(",", "")] += 1
        elif (stem := _stem(word)) in _DIRECTION_STEMS:
            self.directions[stem] += 1
        elif word not in _STOPWORDS and not _PRIME.match(word):
            self.content[stem] += 1


def _words(compounds: Iterable[str]) -> Iterable[str]:
    # "G-quadruplex" and "G quadruplex" compare alike; entities compare whole compounds.
    for compound in compounds:
        parts = compound.split("-") if not compound.endswith("-") else [compound]
        yield from (p for p in parts if p)


def _entity_like(token: str, mixed_case: bool) -> bool:
    if _NUMBER.match(token):
        return False  # numbers get their own comparison
    if any(c.isdigit() for c in token) or any("\u0370" <= c <= "\u03ff" for c in token):
        return True
    letters = [c for c in token if c.isalpha()]
    return mixed_case and len(letters) > 1 and any(c.isupper() for c in letters[1:])


def _only(compounds: list[str], keys: set[str]) -> Counter[str]:
    return Counter(c for c in compounds if c in keys)


def _shared_order(words: list[str], other: list[str]) -> list[str]:
    """`words` without those `other` lacks: what is left must come in the same order."""
    present = set(other)
    return [w for w in words if w in present]


def _content_difference(left: Counter[str], right: Counter[str]) -> Counter[str]:
    return (left - right) + (right - left)


def _has_negated_pair(difference: Counter[str]) -> bool:
    """Whether the differing words include "effective" beside "ineffective" and the like."""
    words = set(difference)
    return any(w.startswith(p) and w[len(p) :] in words for w in words for p in _NEGATED_PREFIXES)


def _stem(word: str) -> str:
    """A light suffix strip: enough for increase/increases/increased/increasing to meet."""
    for suffix in ("ing", "ed", "es", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            word = word[: -len(suffix)]
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


_DIRECTION_STEMS = frozenset(_stem(w) for w in _DIRECTION_WORDS)
