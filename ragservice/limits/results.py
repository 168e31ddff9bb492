"""How many results a request gets (`k`) when it does not say: set here once for the REST API,
the CLI, the client and the service layer below them. Whatever a request says, `k` is at most
`RAGSERVICE_MAX_K` (`settings.limits.max_k`, checked by `request_bounds.check_query`)."""

from __future__ import annotations

SEARCH_K = 10
"""Results a search returns (`POST /v1/search`, `ragservice search`, `client.search`)."""

ANSWER_K = 8
"""Chunks an answer reads as its context (`POST /v1/query`, the OpenAI-style chat,
`ragservice ask`, `client.query`)."""
