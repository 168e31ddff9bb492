"""Feedback on answers as a tenant gives it, and its export as fine-tuning data as a tenant's
admin takes it (audited). The checks and formats are the `feedback` package's."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from ragservice.db import Database
from ragservice.db.models import Feedback
from ragservice.feedback import exports
from ragservice.feedback.collect import FeedbackInput, submit_feedback
from ragservice.feedback.exports import ExportFilter, ExportFormat
from ragservice.services.callers import Caller, audit


def give_feedback(
    db: Database, caller: Caller, query_id: uuid.UUID, feedback: FeedbackInput
) -> Feedback:
    """Store the caller's feedback on its tenant's answer `query_id` (NotFoundError for an
    answer that is not the tenant's; InvalidInputError for bad feedback)."""
    return submit_feedback(
        db,
        tenant_id=caller.tenant_id,
        key_id=caller.key_id,
        query_id=query_id,
        feedback=feedback,
    )


def export_feedback(
    db: Database,
    caller: Caller,
    fmt: ExportFormat,
    flt: ExportFilter,
    *,
    negatives_per_positive: int,
) -> Iterator[bytes]:
    """The export as NDJSON pieces. The filter is resolved here, before the first piece, so
    that a bad one raises at once; the audit entry is written later (`Database.write_later`:
    after the response within a request)."""
    details: dict[str, Any] = {  # as the caller gave them
        "collection": flt.collection,
        "since": None if flt.since is None else flt.since.isoformat(),
        "until": None if flt.until is None else flt.until.isoformat(),
    }
    with db.read() as session:
        flt = exports.resolve_filter(session, flt)
    db.write_later(lambda session: audit(session, caller, "feedback.export", fmt.value, details))
    return exports.ndjson(db, fmt, flt, negatives_per_positive=negatives_per_positive)
