"""Settings of sources (a web site, an S3-compatible bucket, a folder): crawling and its guard."""

from __future__ import annotations

from pydantic import Field

from ragservice.config.group import SettingsGroup


class SourceSettings(SettingsGroup):
    """Sources: where a crawl or a bucket may connect, how fast and how far a crawl goes."""

    allow_private: bool = Field(
        validation_alias="sources_allow_private",
        default=False,
        description=(
            "let web sources and S3 endpoints reach private, loopback, link-local (cloud "
            "metadata), CGNAT and other non-public addresses; off, such an address is "
            "refused at every request and redirect (the SSRF guard). For operators whose "
            "sources are inside their network, and tests"
        ),
    )
    crawl_rate: float = Field(
        default=2.0,
        gt=0,
        le=1000,
        description=(
            "requests per second a crawl makes to one host at most; a robots.txt "
            "`Crawl-delay` slows it further"
        ),
    )
    crawl_max_pages: int = Field(
        default=1000,
        ge=1,
        description=(
            "pages one crawl fetches at most; a crawl stopped by it deletes nothing it "
            "did not reach"
        ),
    )
    crawl_depth: int = Field(
        default=3,
        ge=0,
        le=100,
        description=(
            "links followed from the start page of a site without a sitemap (0: the start "
            "page only)"
        ),
    )
    crawl_user_agent: str = Field(
        default="ragservice/0.1",
        min_length=1,
        description="the User-Agent a crawl sends, and the agent whose robots.txt rules it obeys",
    )
    crawl_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description=(
            "seconds a crawl waits at most for a connection or for the next bytes of an answer "
            "(each read on its own; `crawl_response_seconds` bounds the whole answer)"
        ),
    )
    crawl_response_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description=(
            "seconds one answer of a crawl may take in all, from the request to its last byte, "
            "however slowly its bytes come; a page past it fails (that page only)"
        ),
    )
    run_seconds: float = Field(
        validation_alias="source_run_seconds",
        default=3600.0,
        gt=0,
        le=7 * 86400,
        description=(
            "seconds one run of a source may take; a run past it stops and fails, keeping what "
            "it wrote (whole batches, their states saved) and deleting nothing; the next run "
            "goes on from there"
        ),
    )
    turn_seconds: float = Field(
        validation_alias="source_turn_seconds",
        default=60.0,
        gt=0,
        le=86400,
        description=(
            "seconds a worker's source run keeps its job thread while another tenant's job "
            "waits: then it stops between two documents, done for now (whole batches kept, "
            "nothing deleted), and its next run is queued behind the waiting jobs"
        ),
    )
    max_bytes: int = Field(
        validation_alias="source_max_bytes",
        default=32 * 2**20,
        ge=1,
        description=(
            "the largest document a source fetches (a page, an object, a file); a larger "
            "one is a per-document failure"
        ),
    )
    # -- sources kept in sync (H5: the schedule and what the API may add) ---------------------
    poll_seconds: float = Field(
        validation_alias="sources_poll_seconds",
        default=30.0,
        ge=0,
        description=(
            "how often each job worker (`serve`'s and `ragservice worker`'s) queues a run of "
            "the sources whose schedule is due (0: no scheduled runs from this process)"
        ),
    )
    s3_buckets: str = Field(
        validation_alias="sources_s3_buckets",
        default="",
        description=(
            "comma-separated S3 buckets the API may add sources for (empty: none; the "
            "server's AWS credentials must not read any bucket a tenant names). Operators "
            "at the command line may add any bucket"
        ),
    )
    max_per_collection: int = Field(
        validation_alias="sources_max_per_collection",
        default=50,
        ge=1,
        description="sources one collection may have at most",
    )

    def s3_bucket_names(self) -> frozenset[str]:
        """The buckets of `RAGSERVICE_SOURCES_S3_BUCKETS`."""
        return frozenset(b.strip() for b in self.s3_buckets.split(",") if b.strip())
