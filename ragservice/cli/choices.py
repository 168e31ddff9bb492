"""The choices and bounds that command options declare, mirrored from the library.

Building the commands (`ragservice --help`) must not import the modules that define them,
which load SQLAlchemy and psycopg; `tests/unit/test_cli_startup.py` holds each copy equal to
its original. A command turns a choice into the library's own type where it calls it.
"""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    """`retrieval.options.Mode`: how the chunks are ranked."""

    DENSE = "dense"
    FULLTEXT = "fulltext"
    HYBRID = "hybrid"


class TimeOf(StrEnum):
    """`store.feedback.TimeOf`: what an export's --since/--until bound."""

    FEEDBACK = "feedback"
    QUERY = "query"


class ExportFormat(StrEnum):
    """`feedback.exports.ExportFormat`: the fine-tuning data an export writes."""

    OPENAI_SFT = "openai-sft"
    OPENAI_DPO = "openai-dpo"
    TRL_DPO = "trl-dpo"
    TRIPLETS = "triplets"


# `feedback.exports`: the bounds of --negatives-per-positive and --min-rating/--max-rating.
DEFAULT_NEGATIVES_PER_POSITIVE = 3
MAX_NEGATIVES_PER_POSITIVE = 100
LOWEST_RATING, HIGHEST_RATING = -1, 5
