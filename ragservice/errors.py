"""The one exception hierarchy of the service. The API maps `status_code` to HTTP once."""

from __future__ import annotations


class RagServiceError(Exception):
    """Base of every error the service raises on purpose. `str(err)` is safe to show users."""

    status_code: int = 500


class ConfigurationError(RagServiceError):
    """The service is configured in a way that cannot work (a missing extension, a bad model)."""

    status_code = 500


class DatabaseUnavailableError(RagServiceError):
    """PostgreSQL cannot be reached or started."""

    status_code = 503


class InvalidInputError(RagServiceError):
    """The caller sent something the service cannot accept."""

    status_code = 422


class NotFoundError(RagServiceError):
    """The named tenant, collection, document or job does not exist."""

    status_code = 404


class ConflictError(RagServiceError):
    """The request conflicts with the current state (e.g. a duplicate name)."""

    status_code = 409


class EmbeddingError(RagServiceError):
    """The embedding model could not be loaded or failed on input."""

    status_code = 500
