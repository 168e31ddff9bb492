"""What an ingest did: the counts a run, a job or the CLI reports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ragservice.types import LoadFailure, SkippedFile

ProgressCallback = Callable[[int, int], None]
"""Called with (documents done, chunks written) increments as the run advances."""


@dataclass
class IngestReport:
    new: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failed: list[LoadFailure] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)
    """Files found but not read on purpose (a type no loader reads); they fail nothing."""
    chunks_written: int = 0
    chunks_embedded: int = 0
    chunks_reused: int = 0
    chunks_imported: int = 0
    """Chunks that came with their vectors (counted as they are prepared for writing)."""
    seconds: float = 0.0
    write_seconds: float = 0.0
    """Time the writer spent in write transactions (COPY, triggers, commit)."""
    embed_seconds: float = 0.0
    """Time the model spent embedding (the rest of `seconds` it was idle)."""
    prepare_wait_seconds: float = 0.0
    """Time the model's thread waited for the preparation (loading, tokenizing, chunking)."""
    write_wait_seconds: float = 0.0
    """Time the model's thread waited for the writer to take the next batch."""
    pack_seconds: float = 0.0
    """Time spent packing the postings blocks that large batches appended (once, at the end)."""
    dry_run: bool = False
    restricted: bool = False
    """Whether a document it wrote has readers (its job is then shown to fewer askers)."""

    def add(self, part: IngestReport) -> None:
        """Add what another run did (a worker process's, a batch's) to this one's; its own
        `seconds` are not this run's and stay out."""
        self.new.extend(part.new)
        self.updated.extend(part.updated)
        self.unchanged.extend(part.unchanged)
        self.deleted.extend(part.deleted)
        self.failed.extend(part.failed)
        self.skipped.extend(part.skipped)
        self.restricted = self.restricted or part.restricted
        self.chunks_written += part.chunks_written
        self.chunks_embedded += part.chunks_embedded
        self.chunks_reused += part.chunks_reused
        self.chunks_imported += part.chunks_imported
        self.write_seconds += part.write_seconds
        self.embed_seconds += part.embed_seconds
        self.prepare_wait_seconds += part.prepare_wait_seconds
        self.write_wait_seconds += part.write_wait_seconds

    @property
    def ok(self) -> bool:
        return not self.failed

    def counts(self) -> dict[str, int]:
        return {
            "new": len(self.new),
            "updated": len(self.updated),
            "unchanged": len(self.unchanged),
            "deleted": len(self.deleted),
            "failed": len(self.failed),
            "skipped": len(self.skipped),
            "chunks_written": self.chunks_written,
            "chunks_embedded": self.chunks_embedded,
            "chunks_reused": self.chunks_reused,
            "chunks_imported": self.chunks_imported,
        }
