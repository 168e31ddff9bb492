"""The request framing people type around a question, which the cache key leaves out.

"Can you tell me whether X?", "I want to know if X", "Hey, quick question: X", "X, please",
"X? Thanks in advance!" all ask X. `strip_framing` removes such framings where they lead or end
the text and keeps everything between them, so the key and the meaning guard see X alone.

Only fixed English phrases are removed, each a whole run of words: a verb of asking with its
object ("tell me", "explain", "let me know", "help me understand"), said to someone ("can you",
"could you please") or of oneself ("I want to know", "I was wondering"), then "whether", "if" or
"about"; greetings and lead-ins ("hey,", "quick question:"); and thanks or "please" at the end.
What follows a framing stays whatever it is: "Can you explain why X" keeps "why X", "Tell me if X
does not Y" keeps the negation, "Tell me how many X" keeps the quantity. A bare "Can you X?" is a
question about X ("Can you take aspirin with ibuprofen?") and is left alone, as is a framing that
would leave nothing.

Works on text with its whitespace collapsed to single spaces; each pattern is anchored and
fails fast, so a call costs linear time whatever the text.
"""

from __future__ import annotations

import re

__all__ = ["strip_framing"]

# Verbs of asking, with their object: what a request asks the reader to do.
_TELL = (
    r"(?:tell|show|give) (?:me|us)|let (?:me|us) know|explain(?: to (?:me|us))?"
    r"|help (?:me|us) (?:to )?(?:understand|figure out|find out)|clarify|confirm|check"
    r"|find out|remind (?:me|us)|answer (?:this|me)(?: for me)?"
)
_WHO = r"(?:you|u|someone|somebody|anyone|anybody)"
_SOFTENERS = r"(?:(?:please|kindly|possibly|maybe|just|quickly|briefly) )*"
_KNOW = r"(?:know|understand|find out|learn|ask(?: you)?|check)"
_REQUEST = (
    rf"(?:can|could|would|will) {_WHO} {_SOFTENERS}(?:{_TELL})"
    rf"|(?:please |kindly )+(?:{_TELL})"
    rf"|(?:{_TELL})"
    rf"|(?:i|we)(?: would|'d)(?: really)? (?:like|love|want) (?:you )?to {_KNOW}"
    rf"|(?:i|we)(?: really)?(?: want| need| needed| wanted| hope| hoped| am trying|'m trying"
    rf"| was trying| were trying| are trying|'re trying) to {_KNOW}|i wanna {_KNOW}"
    rf"|(?:do|does|did) {_WHO}(?: here| out there)? (?:happen to |really )?know"
    rf"|{_WHO} (?:here )?knows?|(?:any|got any) ideas?"
    rf"|(?:i|we)(?:'d| would) (?:be (?:very |really |so )?grateful|appreciate it|appreciate)"
    rf" if {_WHO} (?:could|can|would) {_SOFTENERS}(?:{_TELL})"
)
# Framings that say nothing of what follows them ("Curious George …"): only before a link word
# or a question word, which stays.
_MUSING = (
    r"(?:i|we)(?:'m| am| was| were| are|'re) (?:just |really )?(?:wondering|curious)"
    r"|i (?:just )?wonder|(?:just )?wondering|(?:just )?curious"
)
_LINK = r"(?: (?:whether|if|about|regarding))"
_QUESTION_WORD = r"(?= (?:why|how|what|when|where|who|whom|whose|which)\b)"
# Greetings and openers; "Hey Jude" and "Well water" show why each needs its punctuation unless
# a lead-in or a request follows.
_GREETING_WORDS = (
    r"(?:(?:hey|hi|hello|hiya|yo|greetings)(?: there| all| everyone| folks| guys| team)?"
    r"|ok|okay|so|um+|uh+|well|sorry|excuse me|pardon me|please)"
)
_GREETING = rf"{_GREETING_WORDS} ?[,!.:;-]+"
_QUESTION_WORDS = r"(?:(?:a|one|just a|another|quick|simple|random|silly|dumb|honest|genuine) )*"
_LEAD_IN = (
    rf"(?:{_QUESTION_WORDS}question(?: for you)?|(?:i have|i've got|i got|got|we have)"
    rf" (?:a |one )?{_QUESTION_WORDS}question(?: for you)?|just curious|curious) ?[:,!.?-]+"
    rf"|my {_QUESTION_WORDS}question is ?[:,]?"
)
_ASK = rf"(?:{_REQUEST}){_LINK}?|(?:{_MUSING})(?:{_LINK}| ?[:,-]|{_QUESTION_WORD})"
_LEADING = re.compile(
    rf"(?:(?:{_GREETING}|{_GREETING_WORDS}) )*"
    rf"(?P<lead>(?:{_LEAD_IN}) )?(?P<ask>(?:{_ASK}) ?[:,]? )?",
    re.IGNORECASE,
)
# Greetings alone, each followed by its punctuation ("Hey Jude" is not a greeting).
_GREETINGS = re.compile(rf"(?:{_GREETING} )*", re.IGNORECASE)
# Thanks and "please", last in the text. Not as a verb's object ("say please", "how to
# please"): the word before is checked (`_OBJECT_OF`). The abbreviations only as people type
# them: "PLs" (phospholipids) and "TIA" (the attack) are words of their own.
_POLITE_END = re.compile(
    r"(?<![^\s,;:.!?(-])(?:please|(?-i:[Pp]ls|[Pp]lz|[Tt]hx)|(?:many |big )?thanks|thank you"
    r"|cheers)(?: (?:so much|very much|a lot|a ton|in advance|for (?:your|the) help))?[\s.!?)]*$",
    re.IGNORECASE,
)
_OBJECT_OF = frozenset(["say", "says", "said", "saying", "to", "word", "the", "a"])
# After a break in the sentence only: "Was it tested on anyone?" keeps its last word.
_AFTERTHOUGHT_END = re.compile(
    r"(?<=[,;:.!?-]) ?(?:anyone|anybody|any ideas?|any thoughts|thoughts|ideas"
    rf"|if {_WHO} (?:knows?|can)|if possible|if you don't mind|if that makes sense"
    r"|just curious|just wondering|i wonder|i'm curious|i am curious)[\s.!?)]*$",
    re.IGNORECASE,
)


def strip_framing(text: str) -> str:
    """`text` (single-spaced) without the request framing that leads or ends it."""
    stripped = text[_leading_end(text) :]
    stripped = _strip_end(stripped)
    return stripped if any(c.isalnum() for c in stripped) else text


def _leading_end(text: str) -> int:
    leading = _LEADING.match(text)
    if leading is None:
        return 0
    if leading["lead"] or leading["ask"]:
        return leading.end()
    greetings = _GREETINGS.match(text)
    return greetings.end() if greetings else 0


def _strip_end(text: str) -> str:
    if match := _AFTERTHOUGHT_END.search(text):
        return text[: match.start()]
    match = _POLITE_END.search(text)
    if match is None:
        return text
    before = text[: match.start()]
    last = before.rstrip(" ").rsplit(" ", 1)[-1].lower()
    return text if last in _OBJECT_OF and before.endswith(" ") else before
