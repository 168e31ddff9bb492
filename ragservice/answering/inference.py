"""A client for any OpenAI-compatible `POST {base_url}/chat/completions` (vLLM, llama.cpp...).

The boundary of the inference layer: every failure leaves as `UpstreamError` (502) or
`UpstreamTimeoutError` (504), never as an httpx error. Messages are safe to show users: they
name the status and the upstream's own (trimmed) message, never the URL or the API key.

Retries: connection failures, 429 and 5xx, with exponential backoff and jitter, honouring
`Retry-After`. Every call (all attempts, waits and the whole stream) ends by one deadline.
At most `max_concurrent` calls run at once; the others wait for a slot within that deadline.
Slots are shared fairly between owners (tenants, told by `owner`): a freed slot goes to the
waiting owner holding the fewest, so one tenant's burst cannot queue another's calls behind it
(`FairSlots`, limits/fair_slots.py); `max_per_owner` caps what one owner holds at once.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Hashable, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
from httpx_sse import EventSource, ServerSentEvent

from ragservice.answering.prompt import ChatMessage
from ragservice.config import LimitSettings, Settings, is_loopback
from ragservice.errors import ConfigurationError, UpstreamError, UpstreamTimeoutError
from ragservice.limits.fair_slots import FairSlots

log = logging.getLogger(__name__)

T = TypeVar("T")

CHAT_PATH = "chat/completions"  # relative, so it lands under the base URL's path (`/v1/...`)
MAX_RETRY_AFTER = 30.0
"""Seconds; an upstream asking for a longer pause is treated as unavailable for this call."""
_DETAIL_CHARS = 200  # of the upstream's error message kept in ours
_NOT_TRANSIENT_5XX = frozenset({501, 505})  # "not implemented" stays so on retry


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished completion. Token counts are 0 where the upstream did not report usage."""

    text: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None


class _Retryable(Exception):
    """An attempt failed in a way another attempt may not; `error` is raised if none is left."""

    def __init__(self, error: UpstreamError, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


@dataclass
class _StreamState:
    """What a stream has delivered so far; becomes the `Completion` once it has ended."""

    model: str
    parts: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    ended: bool = False

    def absorb(self, chunk: dict[str, Any]) -> str:
        """Record one `chat.completion.chunk`; return its content delta ("" when none)."""
        if isinstance(model := chunk.get("model"), str) and model:
            self.model = model
        if isinstance(usage := chunk.get("usage"), dict):
            self.prompt_tokens, self.completion_tokens = _usage(usage)
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return ""  # the usage-only chunk at the end has no choices
        if isinstance(reason := choices[0].get("finish_reason"), str):
            self.finish_reason = reason
        delta = choices[0].get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
        if not isinstance(content, str) or not content:
            return ""  # the first chunk often carries only the role
        self.parts.append(content)
        return content

    def completion(self) -> Completion:
        return Completion(
            text="".join(self.parts),
            model=self.model,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            finish_reason=self.finish_reason,
        )


class CompletionStream(AsyncIterator[str]):
    """The content deltas of one streamed completion, in order, as the upstream sends them.

    `completion` is None until the stream has ended; then it holds the whole text, the model
    and, where the upstream reported it, the token usage. `aclose()` stops early and frees
    the connection.
    """

    def __init__(self, deltas: AsyncGenerator[str, None], state: _StreamState) -> None:
        self._deltas = deltas
        self._state = state

    async def __anext__(self) -> str:
        return await self._deltas.__anext__()

    async def aclose(self) -> None:
        await self._deltas.aclose()

    @property
    def completion(self) -> Completion | None:
        return self._state.completion() if self._state.ended else None


class InferenceClient:
    """Chat completions from an OpenAI-compatible server, with retries and a per-call deadline.

    `deadline_seconds` bounds each call as a whole (attempts, waits between them and, for a
    stream, every chunk); by default `connect_timeout + read_timeout`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        max_retries: int = 2,
        backoff_seconds: float = 0.5,
        deadline_seconds: float | None = None,
        stream_usage: bool = True,
        max_concurrent: int = 16,
        max_per_owner: int | None = None,
        owner: Callable[[], Hashable] = lambda: None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.model = model
        # Calls beyond this wait for a slot, within their deadline: a burst queues here
        # instead of opening a connection (and an upstream request) per caller.
        self._max_concurrent = max_concurrent
        self.slots = FairSlots(max_concurrent, per_owner=max_per_owner)
        self._owner = owner
        self._api_key = api_key
        self._read_timeout = read_timeout
        self._max_retries = max_retries
        self._backoff = backoff_seconds
        self._deadline_seconds = deadline_seconds or connect_timeout + read_timeout
        # Some servers reject `stream_options`; turning it off loses only the streamed usage.
        self._stream_usage = stream_usage
        self._http = httpx.AsyncClient(
            base_url=_checked_base_url(base_url, api_key),
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout, pool=connect_timeout),
            transport=transport,
        )

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        owner: Callable[[], Hashable] = lambda: None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> InferenceClient | None:
        """The configured client, or None when no inference URL is set (extractive answers).
        `owner` tells whose call is being made (the tenant), for the fair share of slots;
        `transport` carries its requests (default: httpx's; a traced one while tracing)."""
        inference, limits = settings.inference, settings.limits
        if not inference.url:
            return None
        return cls(
            inference.url,
            model=inference.model,
            api_key=(inference.api_key.get_secret_value() if inference.api_key else None),
            connect_timeout=inference.connect_timeout,
            read_timeout=inference.read_timeout,
            max_retries=inference.max_retries,
            max_concurrent=limits.max_concurrent_upstream,
            max_per_owner=upstream_share(limits),
            owner=owner,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- whole completions -----------------------------------------------------------------------

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        """The model's answer to `messages`, once it is complete."""
        payload = self._payload(messages, max_tokens, temperature, stream=False)
        deadline = self._deadline()
        failures = 0
        async with self._slot(deadline):
            while True:
                try:
                    return await self._complete_once(payload, deadline)
                except _Retryable as retry:
                    failures += 1
                    await self._wait_for_retry(retry, failures, deadline)

    async def _complete_once(self, payload: dict[str, Any], deadline: float) -> Completion:
        response = await self._guarded(self._http.post(CHAT_PATH, json=payload), deadline)
        if not response.is_success:
            raise self._status_failure(response)
        return self._parse_completion(response)

    def _parse_completion(self, response: httpx.Response) -> Completion:
        try:
            body = response.json()
            choice = body["choices"][0]
            text = choice["message"].get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            # A 200 from something else: a proxy's login page, a server of another protocol.
            message = "inference upstream sent something other than a completion"
            raise UpstreamError(message) from exc
        prompt_tokens, completion_tokens = _usage(body.get("usage"))
        return Completion(
            text=str(text),
            model=str(body.get("model") or self.model),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason=_str_or_none(choice.get("finish_reason")),
        )

    # -- streams ---------------------------------------------------------------------------------

    def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> CompletionStream:
        """Content deltas as they arrive. Retried only while nothing has been yielded yet."""
        payload = self._payload(messages, max_tokens, temperature, stream=True)
        state = _StreamState(model=self.model)
        return CompletionStream(self._stream_deltas(payload, state), state)

    async def _stream_deltas(
        self, payload: dict[str, Any], state: _StreamState
    ) -> AsyncGenerator[str, None]:
        deadline = self._deadline()
        failures = 0
        async with self._slot(deadline):  # held until the stream ends or is closed
            while True:
                try:
                    async with aclosing(self._stream_once(payload, deadline, state)) as deltas:
                        async for delta in deltas:
                            yield delta
                    return
                except _Retryable as retry:
                    if state.parts:  # the caller holds tokens already; a retry would repeat them
                        raise retry.error from retry.__cause__
                    failures += 1
                    await self._wait_for_retry(retry, failures, deadline)

    async def _stream_once(
        self, payload: dict[str, Any], deadline: float, state: _StreamState
    ) -> AsyncGenerator[str, None]:
        response = await self._open_stream(payload, deadline)
        try:
            async with aclosing(EventSource(response).aiter_sse()) as events:
                while (data := await self._next_data(events, deadline)) is not None:
                    if data.strip() == "[DONE]":
                        break
                    if delta := state.absorb(self._parse_event(data)):
                        yield delta
                else:
                    # Closed without `[DONE]`: cut off, unless the final chunk had arrived.
                    if state.finish_reason is None:
                        message = "inference upstream ended the stream early"
                        raise _Retryable(UpstreamError(message))
            state.ended = True
        finally:
            await response.aclose()

    async def _open_stream(self, payload: dict[str, Any], deadline: float) -> httpx.Response:
        request = self._http.build_request(
            "POST", CHAT_PATH, json=payload, headers={"Accept": "text/event-stream"}
        )
        response = await self._guarded(self._http.send(request, stream=True), deadline)
        if response.is_success:
            media_type = response.headers.get("content-type", "").partition(";")[0].strip()
            if media_type.lower() == "text/event-stream":
                return response
            await response.aclose()
            raise UpstreamError(
                f"inference upstream answered a stream request with {media_type or 'no'} "
                "content, not text/event-stream"
            )
        try:  # the error body names the problem; read it before judging the status
            await self._guarded(response.aread(), deadline)
        finally:
            await response.aclose()
        raise self._status_failure(response)

    async def _next_data(
        self, events: AsyncIterator[ServerSentEvent], deadline: float
    ) -> str | None:
        """The next server-sent event's data (its `data:` lines joined by newlines, as the SSE
        spec has it); None at the end of the body. Events without data (a lone `id:` or
        `retry:`) carry nothing; comments (`: ping`) never become events."""
        while (event := await self._guarded(anext(events, None), deadline)) is not None:
            if event.data:
                return event.data
        return None

    def _parse_event(self, data: str) -> dict[str, Any]:
        try:
            event = json.loads(data)
        except ValueError as exc:
            raise UpstreamError("inference upstream sent an unreadable stream event") from exc
        if not isinstance(event, dict):
            raise UpstreamError("inference upstream sent an unreadable stream event")
        if "error" in event:  # vLLM and others report failures mid-stream as an event
            detail = self._redact(_trim(str(_error_message(event) or "")))
            raise UpstreamError(f"inference upstream failed during the stream: {detail}")
        return event

    # -- shared ----------------------------------------------------------------------------------

    def _payload(
        self, messages: Sequence[ChatMessage], max_tokens: int, temperature: float, *, stream: bool
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [message.to_dict() for message in messages],
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": stream,
        }
        if stream and self._stream_usage:
            payload["stream_options"] = {"include_usage": True}
        return payload

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self._deadline_seconds

    @asynccontextmanager
    async def _slot(self, deadline: float) -> AsyncIterator[None]:
        """One of the `max_concurrent` calls in flight, taken for the caller's owner; the wait
        for it counts against the call's deadline, so a call queued too long fails like a slow
        upstream (504)."""
        owner = self._owner()
        try:
            async with asyncio.timeout_at(deadline):
                await self.slots.acquire_async(owner)
        except TimeoutError as exc:
            message = (
                f"inference upstream busy: {self._max_concurrent} calls in flight "
                f"(RAGSERVICE_MAX_CONCURRENT_UPSTREAM) for {self._deadline_seconds:g} s"
            )
            raise UpstreamTimeoutError(message) from exc
        try:
            yield
        finally:
            self.slots.release(owner)

    async def _guarded(self, pending: Awaitable[T], deadline: float) -> T:
        """Await one httpx step within the call's deadline, converting its failures to ours."""
        try:
            async with asyncio.timeout_at(deadline):
                return await pending
        except TimeoutError as exc:
            message = f"inference upstream did not finish within {self._deadline_seconds:g} s"
            raise UpstreamTimeoutError(message) from exc
        except httpx.HTTPError as exc:
            raise self._transport_failure(exc) from exc

    def _transport_failure(self, exc: httpx.HTTPError) -> Exception:
        """Our error for an httpx one; `_Retryable` where the request may not have been served."""
        if isinstance(exc, httpx.ConnectTimeout):
            return _Retryable(UpstreamTimeoutError("inference upstream: connecting timed out"))
        if isinstance(exc, httpx.TimeoutException):
            # Not retried: the model is busy rather than down, and a retry doubles the wait.
            message = f"inference upstream did not answer within {self._read_timeout:g} s"
            return UpstreamTimeoutError(message)
        if isinstance(exc, httpx.ConnectError):
            return _Retryable(UpstreamError("inference upstream could not be reached"))
        if isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError):
            return _Retryable(UpstreamError("inference upstream closed the connection"))
        return UpstreamError(f"inference upstream request failed ({type(exc).__name__})")

    def _status_failure(self, response: httpx.Response) -> Exception:
        code = response.status_code
        detail = self._redact(_error_detail(response)) or response.reason_phrase
        error = UpstreamError(f"inference upstream answered {code}: {detail}")
        if code == 429 or (code >= 500 and code not in _NOT_TRANSIENT_5XX):
            return _Retryable(error, retry_after=_retry_after(response.headers))
        return error

    async def _wait_for_retry(self, retry: _Retryable, failures: int, deadline: float) -> None:
        """Sleep before attempt `failures + 1`, or raise when no attempt or time is left."""
        if failures > self._max_retries:
            final = (
                _noted(retry.error, f"after {failures} attempts") if failures > 1 else retry.error
            )
            raise final from retry.__cause__
        left = deadline - asyncio.get_running_loop().time()
        if retry.retry_after is not None and retry.retry_after > min(MAX_RETRY_AFTER, left):
            note = f"it asks to retry after {retry.retry_after:g} s, longer than this call may wait"
            raise _noted(retry.error, note) from retry.__cause__
        delay = self._delay(retry, failures)
        if delay >= left:
            raise _noted(retry.error, "no time left to retry") from retry.__cause__
        log.warning(
            "%s; retrying in %.2f s (attempt %d of %d)",
            retry.error,
            delay,
            failures + 1,
            self._max_retries + 1,
        )
        await asyncio.sleep(delay)

    def _delay(self, retry: _Retryable, failures: int) -> float:
        if retry.retry_after is not None:
            return retry.retry_after
        base = self._backoff * 2.0 ** (failures - 1)
        # Jitter keeps clients that failed together from retrying together.
        return base / 2 + random.uniform(0, base / 2)

    def _redact(self, text: str) -> str:
        """Upstreams sometimes echo the key they were sent ("Incorrect API key: sk-...")."""
        return text.replace(self._api_key, "***") if self._api_key else text


def upstream_share(limits: LimitSettings) -> int:
    """The most upstream calls one tenant holds at once: the configured share, else all the
    slots but one (one is always left for the other tenants), and at least one."""
    share = limits.max_concurrent_upstream_per_tenant
    if share is None:
        share = limits.max_concurrent_upstream - 1
    return max(1, min(share, limits.max_concurrent_upstream))


def _checked_base_url(base_url: str, api_key: str | None = None) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigurationError(
            "RAGSERVICE_INFERENCE_URL must be an http(s) URL such as http://localhost:8000/v1"
        )
    if api_key and parts.scheme == "http" and not is_loopback(parts.hostname or ""):
        raise ConfigurationError(
            f"RAGSERVICE_INFERENCE_API_KEY would travel in clear text to {parts.hostname}: "
            "use an https:// RAGSERVICE_INFERENCE_URL (plain http is for this machine only)"
        )
    # One trailing slash, so `chat/completions` resolves under the base path either way.
    return base_url.rstrip("/") + "/"


def _noted(error: UpstreamError, note: str) -> UpstreamError:
    """The same kind of error (timeout or not) with a note on why retrying stopped."""
    return type(error)(f"{error} ({note})")


def _usage(usage: Any) -> tuple[int, int]:
    if not isinstance(usage, dict):
        return 0, 0
    return _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _error_message(body: Any) -> Any:
    """The message of an OpenAI-style error body (`{"error": {"message": ...}}`) or the like."""
    if not isinstance(body, dict):
        return None
    error = body.get("error", body.get("detail", body.get("message")))
    if isinstance(error, dict):
        return error.get("message", error)
    return error


def _error_detail(response: httpx.Response) -> str:
    try:
        message = _error_message(response.json())
    except ValueError:
        message = None
    return _trim(str(message) if message else response.text)


def _trim(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _DETAIL_CHARS else flat[: _DETAIL_CHARS - 1] + "…"


def _retry_after(headers: httpx.Headers) -> float | None:
    """`Retry-After` in seconds, given as seconds or as an HTTP date; None when absent or bad."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)
