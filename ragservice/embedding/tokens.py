"""Tokenize once, in batches: the model's fast tokenizer, for chunking and for the model alike.

Ingest used to tokenize every text three times, one text at a time on the calling thread: the
document for chunking, each chunk to sort by length, and each chunk again inside `encode`.
Here a group of documents is tokenized in one `encode_batch` call (Rust, on every core, with
the GIL released), chunking reads the token spans, and each chunk's model input is the slice of
its document's token ids between the special tokens: no second tokenization at all.

A slice equals the chunk's own tokenization only where tokens never depend on their neighbours
across the chunk's edges. That holds for WordPiece behind the BERT pre-tokenizer (words are
split on whitespace and punctuation, then tokenized alone) when neither edge falls inside a
word; every other chunk, and every other kind of tokenizer, is tokenized on its own, still in
one batch. `tests/unit/test_tokens.py` checks slices against tokenizing the chunk texts.
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

TokenIds = list[int]
"""One text's model input: token ids, special tokens included, truncated to the model's limit."""

Batch = dict[str, npt.NDArray[np.int64]]
"""Padded model inputs by name: input_ids, attention_mask, token_type_ids."""


@dataclass(frozen=True, slots=True)
class DocumentTokens:
    """A whole text's tokens (no special tokens, no truncation) and their character spans."""

    ids: list[int]
    spans: list[tuple[int, int]]

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """The `Tokenizer` protocol, for chunking the text these tokens came from."""
        return self.spans


class BatchTokenizer:
    """The model's fast tokenizer for batches of texts; safe to call from many threads.

    Two private copies of the Rust tokenizer, configured once and never changed afterwards
    (transformers reconfigures its shared one on every call, which other threads then trip
    over): one reads whole documents, the other makes model inputs, truncated as the model
    truncates.
    """

    def __init__(self, hf_tokenizer: Any, *, max_length: int) -> None:
        from tokenizers import Tokenizer

        serialized = hf_tokenizer.backend_tokenizer.to_str()
        self._documents = Tokenizer.from_str(serialized)
        self._documents.no_truncation()
        self._documents.no_padding()
        self._inputs = Tokenizer.from_str(serialized)
        self._inputs.enable_truncation(max_length=max_length)
        self._inputs.no_padding()
        self.max_length = max_length
        self.prefix, self.suffix = _special_affixes(self._inputs)
        self.pad_id = int(getattr(hf_tokenizer, "pad_token_id", None) or 0)
        self._continuations = _wordpiece_continuations(json.loads(serialized))

    @property
    def slices_exact(self) -> bool:
        """Whether a chunk's tokens may be sliced out of its document's (see the module doc)."""
        return self._continuations is not None

    def documents(self, texts: Sequence[str]) -> list[DocumentTokens]:
        """Whole texts' tokens and spans, for chunking (one batch, every core)."""
        encodings = self._documents.encode_batch(list(texts), add_special_tokens=False)
        return [DocumentTokens(e.ids, e.offsets) for e in encodings]

    def model_inputs(self, texts: Sequence[str]) -> list[TokenIds]:
        """Each text's model input, as the model's own tokenizer call would make it."""
        return [e.ids for e in self._inputs.encode_batch(list(texts))]

    @property
    def vocab_size(self) -> int:
        return int(self._inputs.get_vocab_size(with_added_tokens=True))

    def input_from_ids(self, ids: Sequence[int]) -> TokenIds:
        """The model input of a text given as this tokenizer's ids: as `encode(text,
        add_special_tokens=False)` gives them (the special tokens are put around them), or with
        those special tokens already in place. ValueError for no ids, an id outside the
        vocabulary, or more tokens than the model reads."""
        vocab = self.vocab_size
        outside = next((i for i in ids if not 0 <= i < vocab), None)
        if outside is not None:
            raise ValueError(f"token id {outside} is outside the vocabulary (0-{vocab - 1})")
        if not ids:
            raise ValueError("no token ids")
        model_input = list(ids) if self._framed(ids) else [*self.prefix, *ids, *self.suffix]
        if len(model_input) > self.max_length:
            room = self.max_length - len(self.prefix) - len(self.suffix)
            raise ValueError(
                f"{len(model_input) - len(self.prefix) - len(self.suffix)} tokens; "
                f"the model reads at most {room}"
            )
        return model_input

    def _framed(self, ids: Sequence[int]) -> bool:
        """Whether the ids already begin and end with the special tokens (`encode(text)`)."""
        affixes = len(self.prefix) + len(self.suffix)
        return (
            affixes > 0
            and len(ids) >= affixes
            and list(ids[: len(self.prefix)]) == self.prefix
            and list(ids[len(ids) - len(self.suffix) :]) == self.suffix
        )

    def chunk_inputs(
        self,
        document: DocumentTokens,
        ranges: Sequence[tuple[int, int] | None],
        texts: Sequence[str],
    ) -> list[TokenIds]:
        """Model inputs of a document's chunks (character `ranges`, their `texts`): slices of
        the document's ids where exact, the others (and those without a range: a chunk whose
        text is not a slice of the document) tokenized on their own."""
        ends = [end for _, end in document.spans]
        inputs: list[TokenIds | None] = [
            None if r is None else self._slice(document, ends, r) for r in ranges
        ]
        retokenize = [i for i, ids in enumerate(inputs) if ids is None]
        if retokenize:
            fresh = self.model_inputs([texts[i] for i in retokenize])
            for i, ids in zip(retokenize, fresh, strict=True):
                inputs[i] = ids
        return [ids for ids in inputs if ids is not None]

    def _slice(
        self, document: DocumentTokens, ends: list[int], char_range: tuple[int, int]
    ) -> TokenIds | None:
        continuations = self._continuations
        if continuations is None:
            return None
        start, end = char_range
        first = bisect_left(document.spans, (start, -1))
        last = bisect_right(ends, end, lo=first)
        ids = document.ids
        if first < len(ids) and ids[first] in continuations:
            return None  # the chunk starts inside a word
        if last < len(ids) and ids[last] in continuations:
            return None  # the chunk ends inside a word
        room = self.max_length - len(self.prefix) - len(self.suffix)
        return [*self.prefix, *ids[first : min(last, first + room)], *self.suffix]


def pad_batch(inputs: Sequence[TokenIds], pad_id: int = 0) -> Batch:
    """Right-padded model inputs: ids, attention mask and (single-sequence) token type ids."""
    width = max((len(ids) for ids in inputs), default=0)
    input_ids = np.full((len(inputs), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(inputs), width), dtype=np.int64)
    for row, ids in enumerate(inputs):
        input_ids[row, : len(ids)] = ids
        mask[row, : len(ids)] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": mask,
        "token_type_ids": np.zeros_like(input_ids),
    }


def length_batches(inputs: Sequence[TokenIds], batch_size: int) -> list[npt.NDArray[np.intp]]:
    """Row indexes in batches of similar length (longest first), so padding stays small."""
    order = np.argsort(-np.fromiter(map(len, inputs), dtype=np.int64, count=len(inputs)))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def _special_affixes(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the post-processor puts before and after a single text's tokens."""
    probe = "a"
    bare = tokenizer.encode(probe, add_special_tokens=False).ids
    full = tokenizer.encode(probe, add_special_tokens=True).ids
    for at in range(len(full) - len(bare) + 1):
        if full[at : at + len(bare)] == bare:
            return list(full[:at]), list(full[at + len(bare) :])
    raise ValueError("the tokenizer's special tokens do not surround a text's own tokens")


def _wordpiece_continuations(config: dict[str, Any]) -> frozenset[int] | None:
    """Ids of word-continuation tokens ("##ing") when slicing is exact for this tokenizer
    (WordPiece behind the BERT pre-tokenizer), else None."""
    model = config.get("model") or {}
    pre = config.get("pre_tokenizer") or {}
    if model.get("type") != "WordPiece" or pre.get("type") != "BertPreTokenizer":
        return None
    prefix = model.get("continuing_subword_prefix") or "##"
    vocab: dict[str, int] = model.get("vocab") or {}
    return frozenset(i for token, i in vocab.items() if token.startswith(prefix))
