"""Token id arrays back to text, as OpenAI-style clients mean them: tiktoken's ids.

`/v1/embeddings` takes token ids in place of texts because OpenAI's API does, and the clients
that send them (LangChain's `OpenAIEmbeddings` by default) tokenize with tiktoken: the
encoding of the model they name, or `cl100k_base` for a name OpenAI does not know. Read as
the embedding model's own ids, those would embed other words without any error; decoded with
the same tiktoken encoding, they give back the client's text, embedded as any text is.

tiktoken downloads an encoding's file on first use unless it is in its cache
(`TIKTOKEN_CACHE_DIR`). The service never downloads: the encoding is loaded with tiktoken's
file reader refusing URLs, so a file missing from the cache fails at once, naming where it
goes, instead of waiting on the network. A loaded encoding is kept for the process; a failed
load is tried again on the next request (it costs a file lookup), so a file put in place
later is picked up without a restart.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ragservice.errors import InvalidInputError
from ragservice.extras import missing_extra

if TYPE_CHECKING:
    from tiktoken import Encoding

log = logging.getLogger(__name__)

_lock = threading.Lock()
_encodings: dict[str, Encoding] = {}
_reported: set[str] = set()


class EncodingUnavailableError(InvalidInputError):
    """Token arrays cannot be read: the tiktoken encoding is not installed or not cached.

    A 422, not a 5xx: the request cannot be served as sent by this deployment, and clients
    retry server errors; the message tells the caller to send texts instead."""


def tiktoken_texts(arrays: Sequence[Sequence[int]], encoding_name: str) -> list[str]:
    """The texts of token id arrays of the tiktoken encoding `encoding_name`.

    EncodingUnavailableError when the encoding cannot be loaded; InvalidInputError naming the
    input for an empty array, an id the encoding does not have, or ids whose bytes are not
    UTF-8 text."""
    encoding = tiktoken_encoding(encoding_name)
    return [_decode(encoding, ids, f"input[{i}]") for i, ids in enumerate(arrays)]


def tiktoken_encoding(name: str) -> Encoding:
    """The tiktoken encoding `name`, loaded once per process from tiktoken's cache only."""
    with _lock:
        if name not in _encodings:
            _encodings[name] = _load(name)
        return _encodings[name]


def forget_encodings() -> None:
    """Drop the loaded encodings (tests that change TIKTOKEN_CACHE_DIR)."""
    with _lock:
        _encodings.clear()
        _reported.clear()


def _decode(encoding: Encoding, ids: Sequence[int], where: str) -> str:
    if not ids:
        raise InvalidInputError(f"{where}: no token ids")
    bad = next((i for i in ids if not 0 <= i <= encoding.max_token_value), None)
    if bad is None:
        try:
            data = encoding.decode_bytes(list(ids))
        except KeyError:  # an id in a gap of the encoding's range
            bad = next(i for i in ids if not _decodes(encoding, i))
    if bad is not None:
        raise InvalidInputError(
            f"{where}: token id {bad} is not in tiktoken's {encoding.name} encoding "
            f"(ids 0-{encoding.max_token_value}); token arrays are read as {encoding.name} "
            "ids, as OpenAI's clients send them"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"{where}: the token ids do not decode to UTF-8 text with tiktoken's "
            f"{encoding.name} encoding ({exc.reason} at byte {exc.start}): send the text"
        ) from exc


def _decodes(encoding: Encoding, token: int) -> bool:
    try:
        encoding.decode_single_token_bytes(token)
    except KeyError:
        return False
    return True


def _load(name: str) -> Encoding:
    missing = missing_extra("tiktoken", "Reading token id arrays (tiktoken's ids)")
    if missing:
        raise _unavailable(name, missing)
    import tiktoken

    try:
        with _no_downloads():
            return tiktoken.get_encoding(name)
    except _NotCached as exc:
        raise _unavailable(name, str(exc)) from exc
    except ValueError as exc:  # an unknown encoding name, a damaged file
        raise _unavailable(name, f"tiktoken cannot load the encoding {name!r}: {exc}") from exc


class _NotCached(Exception):
    """tiktoken asked for a file that is not in its cache (it would have downloaded it)."""


@contextmanager
def _no_downloads() -> Iterator[None]:
    """tiktoken's file reader (`tiktoken.load.read_file`, which `read_file_cached` calls for
    a file its cache lacks) refusing URLs while an encoding loads; local paths still read."""
    import tiktoken.load

    reader = tiktoken.load.read_file

    def read_local(blobpath: str) -> bytes:
        if "://" in blobpath:
            raise _NotCached(_not_cached(blobpath))
        return reader(blobpath)

    tiktoken.load.read_file = read_local
    try:
        yield
    finally:
        tiktoken.load.read_file = reader


def _not_cached(url: str) -> str:
    """Where tiktoken looks for `url`'s file: its cache folder and the file's name there."""
    folder = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    where = f"TIKTOKEN_CACHE_DIR ({folder})" if folder else "TIKTOKEN_CACHE_DIR (unset)"
    key = hashlib.sha1(url.encode()).hexdigest()
    return (
        f"{url} is not in {where} as {key} (or that copy is damaged), and the service "
        "does not download"
    )


def _unavailable(name: str, reason: str) -> EncodingUnavailableError:
    if reason not in _reported:  # once per reason in the log, for the operator
        _reported.add(reason)
        log.warning("token id arrays cannot be read with tiktoken's %s: %s", name, reason)
    return EncodingUnavailableError(
        f"input: token id arrays are read as tiktoken {name} ids, and this server cannot "
        f"load that encoding ({reason}). Send the texts instead (LangChain: "
        "OpenAIEmbeddings(check_embedding_ctx_length=False)), or the operator installs "
        "'ragservice[tiktoken]' and puts the encoding's file in TIKTOKEN_CACHE_DIR "
        "(docs/api.md, embeddings)"
    )
