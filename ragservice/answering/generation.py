"""How an answer's text is produced, as pieces: extractively, by the inference layer (one
completion, or streamed), or replayed from the cache; and what an upstream failure does.

Each `Generation` yields raw pieces; once they are exhausted, `result` holds the whole
`Generated` text with its model, status and token counts. The answering sequence cleans the
pieces as they pass (`answer.AnswerPipeline`), whatever produced them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from ragservice.answering.context import Context
from ragservice.answering.context import extractive_answer as extract
from ragservice.answering.inference import Completion, InferenceClient
from ragservice.answering.prompt import ChatMessage
from ragservice.answering.question import AnswerStatus
from ragservice.errors import UpstreamError, UpstreamTimeoutError
from ragservice.metrics import Metrics

EXTRACTIVE_MODEL = "extractive"


@dataclass
class Generated:
    text: str
    model: str
    status: AnswerStatus
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


def extractive(context: Context) -> Generated:
    """The best passages as the answer (no inference layer, or its failure with a fallback)."""
    return Generated(text=extract(context), model=EXTRACTIVE_MODEL, status="extractive")


@dataclass(frozen=True)
class UpstreamPolicy:
    """What an inference failure does: counted (`ragservice_upstream_errors_total`), then an
    extractive answer when the caller asked for one and nothing was sent yet, else raised."""

    metrics: Metrics | None = None

    def failed(
        self, exc: UpstreamError, context: Context, *, fallback: bool, started: bool
    ) -> Generated:
        if self.metrics is not None:
            kind = "timeout" if isinstance(exc, UpstreamTimeoutError) else "error"
            self.metrics.upstream_errors.labels(kind=kind).inc()
        if fallback and not started:
            answer = extractive(context)
            answer.error = str(exc)
            return answer
        raise exc


class Generation:
    """A text already finished when the answer starts (an extractive or a cached answer): the
    sequence cleans it whole, then gives it in `split` pieces."""

    live = False

    def __init__(self, result: Generated, *, word_sized: bool = False) -> None:
        self.result = result
        self._word_sized = word_sized

    def split(self, text: str) -> list[str]:
        """The finished text in pieces: word-sized (as a live answer would arrive), or whole."""
        return word_pieces(text) if self._word_sized else [text]

    async def pieces(self) -> AsyncIterator[str]:
        yield self.result.text


class Completed(Generation):
    """One completion of the inference layer, given as one piece; `pieces` produces it (and
    sets `result`), each piece to be cleaned as it passes."""

    live = True

    def __init__(
        self,
        inference: InferenceClient,
        messages: list[ChatMessage],
        *,
        sampling: tuple[int, float],
        model: str,
        on_failure: Fallback,
    ) -> None:
        super().__init__(Generated(text="", model=model, status="ok"))
        self._inference = inference
        self._messages = messages
        self._sampling = sampling
        self._on_failure = on_failure

    async def pieces(self) -> AsyncIterator[str]:
        max_tokens, temperature = self._sampling
        try:
            completion = await self._inference.complete(
                self._messages, max_tokens=max_tokens, temperature=temperature
            )
        except UpstreamError as exc:
            self.result = self._on_failure(exc, started=False)
        else:
            self.result = Generated(
                text=completion.text,
                model=completion.model or self.result.model,
                status="ok",
                prompt_tokens=completion.prompt_tokens,
                completion_tokens=completion.completion_tokens,
            )
        yield self.result.text


class Streamed(Completed):
    """A streamed completion of the inference layer, given as its deltas arrive."""

    async def pieces(self) -> AsyncIterator[str]:
        max_tokens, temperature = self._sampling
        stream = self._inference.stream(
            self._messages, max_tokens=max_tokens, temperature=temperature
        )
        pieces: list[str] = []
        try:
            async with aclosing(stream):
                async for piece in stream:
                    pieces.append(piece)
                    yield piece
        except UpstreamError as exc:
            self.result = self._on_failure(exc, started=bool(pieces))
            yield self.result.text
        else:
            self.result = _streamed(pieces, stream.completion, self.result.model)


class Fallback:
    """`UpstreamPolicy.failed` bound to one answer's context and fallback choice."""

    def __init__(self, policy: UpstreamPolicy, context: Context, *, fallback: bool) -> None:
        self._policy = policy
        self._context = context
        self._fallback = fallback

    def __call__(self, exc: UpstreamError, *, started: bool) -> Generated:
        return self._policy.failed(exc, self._context, fallback=self._fallback, started=started)


def _streamed(pieces: list[str], completion: Completion | None, model: str) -> Generated:
    """A finished stream; usage as the upstream reported it, else one token per piece."""
    if completion is None:
        return Generated(
            text="".join(pieces), model=model, status="ok", completion_tokens=len(pieces)
        )
    return Generated(
        text="".join(pieces),
        model=completion.model or model,
        status="ok",
        prompt_tokens=completion.prompt_tokens,
        completion_tokens=completion.completion_tokens or len(pieces),
    )


def word_pieces(text: str) -> list[str]:
    """A finished answer in word-sized pieces, as a live one would arrive."""
    words = text.split(" ")
    return [word + (" " if i < len(words) - 1 else "") for i, word in enumerate(words)]
