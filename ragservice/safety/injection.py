"""Instruction-like passages: a rule-based detector run on every chunk at ingest.

`scan(text)` says whether a passage reads like instructions to a language model rather than
like content (and which rules matched). A flagged chunk is kept, marked, and handled as its
collection says (`flagged_chunks`: mark, downweight or drop); answers built from one are never
cached. The prompt's delimiters and neutralised sources hold whether or not a passage is
flagged: the detector is a second line, not the only one.

The text is read in several views, each normalised (NFKC, lower case, zero-width and
direction marks removed, a few Cyrillic and Greek look-alikes mapped to Latin, whitespace
collapsed): as written, with s p a c e d letters joined, with HTML entities and %-escapes
decoded, as ROT13, and each base64 blob that decodes to text. Rules come in two strengths: a
strong one flags alone ("ignore all previous instructions", a fake `<|im_start|>system` turn);
weak ones ("you must", "the assistant") flag only two together, so a sentence of ordinary
prose that happens to match one is not flagged. Tuned on SciFact: see benchmarks/injection.py.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import html
import re
import unicodedata
import urllib.parse
from dataclasses import dataclass

# Zero-width characters, soft hyphens, direction marks and overrides: invisible in a rendered
# page, they split words so that plain patterns miss them.
_INVISIBLE = re.compile("[\u00ad\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")
# Look-alikes NFKC leaves alone (Cyrillic and Greek letters drawn like Latin ones), mapped in
# words that mix them with Latin letters only, so Russian or Greek text stays as it is.
_CONFUSABLES = str.maketrans("аеорсхуікмтнвαεορτυνκι", "aeopcxyikmthbaeoptuvki")
_WORD = re.compile(r"\w+")
_SPACED = re.compile(r"\b(?:[a-z][ .\-_*]+){3,}[a-z]\b")
_NOT_LETTERS = re.compile(r"[^a-z]+")
_BASE64 = re.compile(r"[A-Za-z0-9+/]{24,}={0,2}")
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a passage reads like instructions to a model, and the rules that matched."""

    flagged: bool
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Rule:
    """A named pattern, and the strings it cannot match without (one of them at least): a
    view holding none of them is passed over without running the pattern. Substring tests
    cost microseconds where each pattern costs a tenth of a millisecond on a page of text,
    and most passages hold the needles of a few rules only. `tests/unit/test_safety.py`
    checks every rule's needles against its pattern."""

    name: str
    pattern: re.Pattern[str]
    needles: tuple[str, ...] = ()

    def search(self, view: str, present: frozenset[str] | None = None) -> bool:
        """Whether the pattern matches `view`; `present`: the needles known to be in it
        (`needles_in`), which spares testing each rule's needles one by one."""
        if self.needles:
            if present is None:
                if not any(needle in view for needle in self.needles):
                    return False
            elif present.isdisjoint(self.needles):
                return False
        return self.pattern.search(view) is not None


def _rules(*rules: tuple[str, str, str]) -> tuple[Rule, ...]:
    """(name, pattern, needles separated by `|`; empty: always run)."""
    return tuple(
        Rule(name, re.compile(pattern, re.MULTILINE), tuple(n for n in needles.split("|") if n))
        for name, pattern, needles in rules
    )


def _any(words: str) -> str:
    """`"a b c"` → `(?:a|b|c)`; `_` stands for a space inside a phrase."""
    return "(?:" + "|".join(word.replace("_", " ") for word in words.split()) + ")"


_IGNORE = _any("ignore disregard forget override bypass neglect discard drop abandon")
_PRIOR = _any(
    "previous prior above earlier preceding foregoing original initial all any your system "
    "developer the"
)
_ORDERS = _any(
    "instructions? directions? directives? prompts? rules guidelines guardrails context "
    "messages? commands? constraints orders guidance programming policies"
)
_ROLE = _any("system assistant developer user human ai model")
_MODEL = _any("ai assistant language_model llm chatbot chat_?gpt gpt-?\\d* claude gemini bot")
_REPLY = _any("respond reply answer say output write")
_NEAR = r"[^.\n]{0,40}"

STRONG = _rules(
    (
        "ignore_instructions",
        rf"\b{_IGNORE}\b{_NEAR}\b{_PRIOR}\b[^.\n]{{0,30}}\b{_ORDERS}\b",
        "ignore|disregard|forget|override|bypass|neglect|discard|drop|abandon",
    ),
    (
        "new_instructions",
        r"\b" + _any("new updated revised real actual true secret hidden") + r"\s+(?:system\s+)?"
        r"(?:instructions?|directives?|task|orders|rules)\s*(?:are|is|follow)?\s*:",
        ":",
    ),
    (
        "from_now_on",
        _any("from_now_on henceforth starting_now for_the_rest_of_(?:this|the)_conversation")
        + rf"[^.\n]{{0,30}}\b(?:you|your|{_MODEL})\b",
        "from now on|henceforth|starting now|for the rest of",
    ),
    (
        "you_are_now",
        r"\byou are (?:now|no longer|actually|henceforth)\b"
        r"|\byour (?:new |real )?(?:role|persona|identity|name) is\b",
        "you are |your ",
    ),
    (
        "pretend",
        r"\b(?:pretend|imagine|role-?play)\s+(?:to be|you are|that you|as|being)\b",
        "pretend|imagine|role",
    ),
    (
        "chat_markup",
        r"<\|?\s*(?:im_start|im_end|endoftext|eot_id|start_header_id|system|assistant|user)"
        r"\s*\|?>|\[/?(?:inst|sys)\]|<</?sys>>",
        "<|[",
    ),
    ("fake_turn", rf"^\s*(?:#+\s*)?{_ROLE}\s*(?:message|prompt|turn|override)?\s*:\s*\S", ":"),
    (
        "fake_tag",
        rf"</?\s*(?:{_ROLE}|sources?|context|instructions?|documents?|prompt)(?:[-_][\w-]*)?\s*>",
        "<",
    ),
    (
        "jailbreak",
        r"\b"
        + _any(
            "do_anything_now dan_mode developer_mode god_mode jailbreak(?:ed|ing)? "
            "unfiltered_mode no_restrictions"
        )
        + r"\b",
        "do anything now|dan mode|developer mode|god mode|jailbreak|unfiltered mode"
        "|no restrictions",
    ),
    (
        "reveal_secrets",
        r"\b"
        + _any("reveal print repeat show output disclose leak tell_me send display")
        + rf"\b{_NEAR}\b"
        + _any(
            "system_prompt initial_prompt hidden_prompt api_keys? password credentials "
            "conversation_history chat_history your_instructions"
        )
        + r"\b",
        "system prompt|initial prompt|hidden prompt|api key|password|credentials"
        "|conversation history|chat history|your instructions",
    ),
    (
        "exfiltrate",
        r"\b"
        + _any("send post upload forward leak exfiltrate transmit")
        + r"\b[^.\n]{0,60}\b(?:https?://|www\.)",
        "http|www.",
    ),
    ("markdown_image", r"!\[[^\]\n]*\]\(\s*(?:https?:)?//", "!["),
    (
        "answer_override",
        rf"\b(?:instead|regardless)\b[^.\n]{{0,30}}\b{_REPLY}\b[^.\n]{{0,20}}"
        r"\b(?:only|with|exactly)\b",
        "instead|regardless",
    ),
    (
        "address_model",
        r"\b"
        + _any("attention note_to message_to dear hey hello important_for instructions?_for")
        + rf"\s*(?:the\s+)?{_MODEL}\b",
        "attention|note to|message to|dear|hey|hello|important for|instruction",
    ),
    # French, German, Spanish / Italian / Portuguese, Dutch, Russian, Chinese and Japanese.
    (
        "ignore_fr",
        r"\b(?:ignore[rz]?|oublie[rz]?|ne tiens pas compte d)\b[^.\n]{0,30}"
        r"\b(?:instructions?|consignes|directives|règles)\b",
        "ignore|oublie|ne tiens pas compte d",
    ),
    (
        "ignore_de",
        r"\b(?:ignorier(?:e|en)?|vergiss|vergessen sie|missachte)\b[^.\n]{0,30}"
        r"\b(?:anweisungen|instruktionen|befehle|regeln|vorgaben)\b",
        "ignorier|vergiss|vergessen sie|missachte",
    ),
    (
        "ignore_es_it_pt",
        r"\b(?:ignora(?:r)?|olvida(?:r)?|ignore|dimentica|esquece|desconsidera)\b[^.\n]{0,30}"
        r"\b(?:instrucciones|istruzioni|instruções|instrucoes|reglas|regole|regras)\b",
        "ignora|olvida|ignore|dimentica|esquece|desconsidera",
    ),
    (
        "ignore_nl",
        r"\b(?:negeer|vergeet)\b[^.\n]{0,30}\b(?:instructies|regels|opdrachten)\b",
        "negeer|vergeet",
    ),
    (
        "ignore_ru",
        r"(?:игнорируй|игнорируйте|забудь|забудьте|не обращай)[^.\n]{0,30}"
        r"(?:инструкци|указани|правил)",
        "игнорируй|забудь|не обращай",
    ),
    (
        "ignore_zh_ja",
        r"(?:忽略|忽视|无视|忘记|忘掉|不要理会|無視|忘れ)[^。\n]{0,12}"
        r"(?:指令|指示|说明|說明|规则|規則|命令|提示)|(?:指令|指示|命令)[^。\n]{0,8}(?:を)?(?:無視|忽略)",
        "忽略|忽视|无视|忘记|忘掉|不要理会|無視|忘れ",
    ),
    (
        "you_are_now_intl",
        r"\b(?:tu es maintenant|vous êtes maintenant|du bist jetzt|sie sind jetzt|ahora eres"
        r"|ora sei|agora você é)\b|你现在是|你現在是|あなたは今",
        "tu es maintenant|vous êtes maintenant|du bist jetzt|sie sind jetzt|ahora eres"
        "|ora sei|agora você é|你现在是|你現在是|あなたは今",
    ),
)

WEAK = _rules(
    (
        "second_person_order",
        rf"\b(?:you|{_MODEL})\s+"
        + _any("must should shall will need_to have_to are_required_to")
        + r"\s+(?:now\s+)?"
        + _any(
            "respond reply answer say output write tell include recommend state claim refuse "
            "mention use print ignore follow obey"
        )
        + r"\b",
        "must|should|shall|will|need to|have to|are required to",
    ),
    (
        "imperative_reply",
        r"(?:^|[.!?:]\s+)(?:please\s+)?"
        + _any("respond reply answer say output print write state tell_the_user recommend")
        + r"\s+(?:only|with|that|exactly|in|the following)\b",
        "respond|reply|answer|say|output|print|write|state|tell the user|recommend",
    ),
    (
        "do_not_reveal",
        r"\b(?:do not|don't|never)\s+"
        + _any("mention reveal tell cite disclose say refer_to acknowledge")
        + r"\b",
        "do not|don't|never",
    ),
    (
        "mentions_model",
        rf"\b(?:the|this|an?)\s+{_MODEL}\b|\b(?:language model|chatbot|chatgpt|the assistant)\b",
        " ai|\nai|assistant|language model|llm|chatbot|chat|gpt|claude|gemini|bot",
    ),
    (
        "mentions_prompt",
        r"\b"
        + _any(
            "system_prompt the_prompt these_instructions this_instruction "
            "the_instructions_above your_instructions your_answer your_response your_reply "
            "the_user"
        )
        + r"\b",
        "system prompt|the prompt|these instructions|this instruction|the instructions above"
        "|your instructions|your answer|your response|your reply|the user",
    ),
    (
        "link_request",
        r"\b(?:include|append|insert|embed|add|render)\b[^.\n]{0,50}"
        r"\b(?:link|url|image|markdown|hyperlink)\b",
        "link|url|image|markdown",
    ),
    (
        "urgency",
        r"\b(?:important|urgent|attention|warning|override|admin(?:istrator)?|priority)\s*[:!]",
        ":|!",
    ),
)


# Over the letters of s p a c e d - o u t runs alone, where words run together.
SQUASHED = _rules(
    (
        "ignore_instructions",
        r"(?:ignore|disregard|forget)(?:all|the|any|your)?(?:previous|prior|above|earlier)"
        r"(?:instructions|prompts?|rules|context)",
        "",
    ),
    ("you_are_now", r"youarenow|fromnowonyou", ""),
)


def scan(text: str) -> Verdict:
    """Whether `text` reads like instructions to a model: a strong rule, or two weak ones."""
    reasons: set[str] = set()
    for view in _views(text):
        present = needles_in(view)
        reasons.update(rule.name for rule in STRONG if rule.search(view, present))
        reasons.update(f"weak:{rule.name}" for rule in WEAK if rule.search(view, present))
    plain = normalise(text)
    for run in _SPACED.finditer(plain):  # with the words next to the run
        letters = _NOT_LETTERS.sub("", plain[max(run.start() - 20, 0) : run.end() + 20])
        reasons.update(rule.name for rule in SQUASHED if rule.search(letters))
    strong = [reason for reason in reasons if not reason.startswith("weak:")]
    flagged = bool(strong) or len(reasons) >= 2
    return Verdict(flagged, tuple(sorted(reasons)) if flagged else ())


_NEEDLES = tuple(sorted({needle for rule in (*STRONG, *WEAK) for needle in rule.needles}))


def needles_in(view: str) -> frozenset[str]:
    """The rules' needles that occur in `view`: each distinct needle tested once, in one
    comprehension, instead of each rule testing its own (the detector's largest cost)."""
    return frozenset([needle for needle in _NEEDLES if needle in view])


def normalise(text: str) -> str:
    """NFKC, invisible characters removed, look-alikes mapped, lower case, spaces collapsed."""
    text = unicodedata.normalize("NFKC", text)
    text = _INVISIBLE.sub("", text).lower()
    if not text.isascii():  # look-alikes hide only in words that are not all ASCII
        text = _WORD.sub(_unmix, text)
    return "\n".join(_WHITESPACE.sub(" ", line).strip() for line in text.splitlines())


def _views(text: str) -> list[str]:
    plain = normalise(text)
    decoded = normalise(urllib.parse.unquote(html.unescape(text)))
    views = [plain, codecs.decode(plain, "rot13")]
    if decoded != plain:
        views.append(decoded)
    views.extend(normalise(blob) for blob in _base64_texts(text))
    return views


def _unmix(match: re.Match[str]) -> str:
    word = match[0]
    mixed = word.isascii() is False and any("a" <= ch <= "z" for ch in word)
    return word.translate(_CONFUSABLES) if mixed else word


def _base64_texts(text: str) -> list[str]:
    """The blobs in `text` that decode from base64 to mostly printable UTF-8."""
    found: list[str] = []
    for match in _BASE64.finditer(text):
        blob = match[0]
        try:
            decoded = base64.b64decode(blob + "=" * (-len(blob) % 4)).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            continue
        if sum(ch.isprintable() or ch.isspace() for ch in decoded) >= 0.9 * len(decoded):
            found.append(decoded)
    return found
