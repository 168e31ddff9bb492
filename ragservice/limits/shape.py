"""Fixed limits on the shape of input, shared by the API, the filters and the loaders.

They are not settings: each protects something that has a hard limit of its own. A B-tree index
entry holds about 2.7 kB, so a longer external id fails its whole write batch; JSON nested
thousands deep overflows Python's recursion limit (and PostgreSQL's stack) on the way; a
statement takes at most 65,535 parameters; PostgreSQL's integers have a largest value.
"""

from __future__ import annotations

from collections.abc import Mapping

MAX_EXTERNAL_ID_BYTES = 1024
"""The longest external id (or uploaded file name), in UTF-8 bytes."""

MAX_JSON_DEPTH = 32
"""The deepest nesting of arrays and objects in metadata and filters."""

MAX_COLLECTIONS_PER_REQUEST = 1000
"""The most collection names one search or answer may list (`rag:a,b,...` in chat too)."""

MAX_INT4 = 2**31 - 1
"""The largest PostgreSQL `integer` (a model version, a TTL)."""

MAX_INT8 = 2**63 - 1
"""The largest PostgreSQL `bigint` (an audit entry's id)."""


def json_depth(value: object) -> int:
    """How deep `value` nests lists and mappings (a scalar: 0); iterative, so any depth is fine.

    Stops counting once past `MAX_JSON_DEPTH`, so a hostile value costs no more than a fine one.
    """
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack and deepest <= MAX_JSON_DEPTH:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: list[object] = list(item.values())
        elif isinstance(item, list | tuple):
            children = list(item)
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def too_deep(value: object) -> bool:
    return json_depth(value) > MAX_JSON_DEPTH


def external_id_too_long(external_id: str) -> bool:
    return len(external_id.encode("utf-8", errors="surrogatepass")) > MAX_EXTERNAL_ID_BYTES
