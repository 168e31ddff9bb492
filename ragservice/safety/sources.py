"""Retrieved text made safe to quote in a prompt: it cannot close or open the sources block,
forge a source header or a chat turn.

The prompt puts the sources between tags named afresh for each question (`new_tag`), so a
document cannot know the closing tag in advance; `neutralise` also rewrites anything in the
text that looks like a tag (`<` then a letter, `/`, `|` or `!`, in any of its look-alike
forms) to start with U+2039 instead, and a line starting with `[n]` (a source header) to `(n)`.
Invisible characters go first, so `<\u200b/sources>` is seen for what it is. Text is otherwise
unchanged: `p < 0.05` and inline citations such as `[12]` stay as written.
"""

from __future__ import annotations

import re
import secrets

_INVISIBLE = re.compile("[\u00ad\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")
# `<`, the full-width and small forms, and angle brackets a model reads the same way.
_TAG_OPEN = re.compile(r"[<\uff1c\ufe64\u2329\u3008\u27e8](?=\s*[/|!A-Za-z\uff0f\uff5c\uff01])")
_HEADER = re.compile(r"^([ \t]*)[\[\uff3b]\s*([0-9\uff10-\uff19]+)\s*[\]\uff3d]", re.MULTILINE)
_CHAT_MARK = re.compile(r"\|>|<\|")


def _quote_chat_mark(match: re.Match[str]) -> str:
    return match[0].replace("<", "\u2039").replace(">", "\u203a")


def new_tag() -> str:
    """A sources tag no document can guess: `sources-` and 16 random hex digits."""
    return f"sources-{secrets.token_hex(8)}"


def neutralise(text: str) -> str:
    """`text` without anything a model could read as a tag, a chat turn or a source header."""
    text = _INVISIBLE.sub("", text)
    text = _TAG_OPEN.sub("\u2039", text)
    text = _CHAT_MARK.sub(
        lambda match: match[0].replace("<", "\u2039").replace(">", "\u203a"), text
    )
    return _HEADER.sub(r"\1(\2)", text)
