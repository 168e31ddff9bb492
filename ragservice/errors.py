"""The one exception hierarchy of the service. The API maps `status_code` to HTTP once."""

from __future__ import annotations

import math


class RagServiceError(Exception):
    """Base of every error the service raises on purpose. `str(err)` is safe to show users."""

    status_code: int = 500


class ConfigurationError(RagServiceError):
    """The service is configured in a way that cannot work (a missing extension, a bad model)."""

    status_code = 500


class DatabaseUnavailableError(RagServiceError):
    """PostgreSQL cannot be reached or started."""

    status_code = 503


class BadRequestError(RagServiceError):
    """The request is malformed in a way no field-level validation describes."""

    status_code = 400


class AuthenticationError(RagServiceError):
    """No API key, or one the service does not know (or that was revoked)."""

    status_code = 401


class PermissionDeniedError(RagServiceError):
    """The key is valid but its role may not do this."""

    status_code = 403


class InvalidInputError(RagServiceError):
    """The caller sent something the service cannot accept."""

    status_code = 422


class PayloadTooLargeError(RagServiceError):
    """A body, a file or a batch exceeds a configured limit."""

    status_code = 413


class RateLimitedError(RagServiceError):
    """The API key made more requests than its rate limit allows; `retry_after` is in seconds."""

    status_code = 429

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        # Whole seconds, as the Retry-After header has them; never 0, which invites a hot loop.
        self.retry_after = max(1, math.ceil(retry_after))


class UnsupportedMediaTypeError(RagServiceError):
    """An uploaded file of a type the loaders cannot read."""

    status_code = 415


class NotFoundError(RagServiceError):
    """The named tenant, collection, document or job does not exist."""

    status_code = 404


class ConflictError(RagServiceError):
    """The request conflicts with the current state (e.g. a duplicate name)."""

    status_code = 409


class BackupError(RagServiceError):
    """A backup could not be taken or restored (a PostgreSQL program failed, a damaged copy)."""

    status_code = 500


class EmbeddingError(RagServiceError):
    """The embedding model could not be loaded or failed on input."""

    status_code = 500


class UpstreamError(RagServiceError):
    """The inference layer answered with an error, or could not be reached."""

    status_code = 502


class UpstreamTimeoutError(UpstreamError):
    """The inference layer did not answer in time."""

    status_code = 504


class ServiceStoppingError(RagServiceError):
    """The server is stopping (SIGTERM): a streamed answer was cut short; ask again (another
    replica, or this one once it is back)."""

    status_code = 503


class ServiceUnreachableError(RagServiceError):
    """A client (`ragservice.client`) could not reach the server, or lost it mid-answer."""

    status_code = 503
