"""Settings of the question path: search, answering, the inference server, the prompt cache."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from ragservice.config.group import SettingsGroup

DEFAULT_EF_SEARCH = {"float32": 100, "halfvec": 100, "binary": 40}
"""HNSW ef_search per vector storage when no setting names one (docs/benchmarks.md: the
recall@10 / latency curve of `benchmarks/scale.py`'s `recall_vs_ef`). float32 and halfvec: 100
(recall 0.96 at 40, 0.98 at 100, 0.99 at 200 for +50% p95); binary: 40, since its recall is set
by the re-scored candidates (`binary_rescore_factor`), which ef_search is raised to anyway."""


class SearchSettings(SettingsGroup):
    """Ranking: dense (HNSW ef_search, binary re-scoring), full text (BM25, RM3), their fusion."""

    hnsw_ef_search: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description=(
            "HNSW candidate list per query for every vector storage (as before: existing "
            "deployments keep their value), raised to `k` when `k` is larger; unset: each"
            " storage's own (`RAGSERVICE_HNSW_EF_SEARCH_<STORAGE>`)"
        ),
    )
    hnsw_ef_search_float32: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description=(
            "ef_search of a model stored as float32; wins over "
            "`RAGSERVICE_HNSW_EF_SEARCH`; neither set: 100 (see docs/benchmarks.md, "
            "`recall_vs_ef`)"
        ),
    )
    hnsw_ef_search_halfvec: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description=(
            "ef_search of a model stored as halfvec; wins over "
            "`RAGSERVICE_HNSW_EF_SEARCH`; neither set: 100"
        ),
    )
    hnsw_ef_search_binary: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description=(
            "ef_search of a binary model's bit index; wins over "
            "`RAGSERVICE_HNSW_EF_SEARCH`; neither set: 40"
        ),
    )
    binary_rescore_factor: int = Field(
        default=4,
        ge=1,
        le=100,
        description=(
            "binary storage: candidates read from the bit index per result asked, then "
            "re-scored by exact cosine"
        ),
    )
    rrf_k: int = Field(
        validation_alias="search_rrf_k",
        default=30,
        ge=1,
        le=1000,
        description="reciprocal rank fusion constant (`SEARCH_FUSION=rrf`)",
    )
    dense_candidates: int = Field(
        validation_alias="search_dense_candidates",
        default=100,
        ge=1,
        le=1000,
        description="candidates the dense side contributes to hybrid fusion (at least `k`)",
    )
    text_candidates: int = Field(
        validation_alias="search_text_candidates",
        default=100,
        ge=1,
        le=1000,
        description="candidates the full-text side contributes to hybrid fusion (at least `k`)",
    )
    fusion: Literal["rrf", "minmax", "zscore", "dbsf"] = Field(
        validation_alias="search_fusion",
        default="zscore",
        description=(
            "how hybrid search fuses its two candidate lists: `rrf` (reciprocal rank "
            "fusion), or normalised scores weighted and summed: `minmax`, `zscore`, "
            "`dbsf` (chosen on SciFact's train queries: docs/benchmarks.md)"
        ),
    )
    text_weight: float = Field(
        validation_alias="search_text_weight",
        default=0.5,
        ge=0,
        le=1,
        description="hybrid: the full-text side's weight (the dense side's is 1 minus it)",
    )
    adaptive_weight: bool = Field(
        validation_alias="search_adaptive_weight",
        default=False,
        description="hybrid: weigh each side per query by how peaked its normalised scores are",
    )
    prf: Literal["off", "rm3"] = Field(
        validation_alias="search_prf",
        default="off",
        description=(
            "`rm3`: pseudo-relevance feedback for full text (and hybrid's full-text "
            "side); it lost on SciFact train, so off"
        ),
    )
    prf_docs: int = Field(
        validation_alias="search_prf_docs",
        default=10,
        ge=1,
        le=50,
        description="RM3: first-pass chunks the expansion comes from",
    )
    prf_terms: int = Field(
        validation_alias="search_prf_terms",
        default=20,
        ge=1,
        le=50,
        description="RM3: lexemes added to the query at most",
    )
    prf_query_weight: float = Field(
        validation_alias="search_prf_query_weight",
        default=0.7,
        ge=0,
        le=1,
        description="RM3: the original query's share of the weight (the train-best variant)",
    )
    document_share: float = Field(
        validation_alias="search_document_share",
        default=0.0,
        ge=0,
        le=1,
        description=(
            "`group_by: document`: each of a document's next two best chunks adds this "
            "share of its score (0: documents rank by their best chunk)"
        ),
    )
    bm25_k1: float = Field(
        default=0.9,
        ge=0,
        le=10,
        description="BM25 term-frequency saturation of full-text search",
    )
    bm25_b: float = Field(
        default=0.4,
        ge=0,
        le=1,
        description="BM25 length normalisation of full-text search",
    )
    bm25_postings_per_term: int = Field(
        default=2_000,
        ge=1,
        description=(
            "where full text is not exact (a filtered search, or a database without the "
            "`ragservice_bm25` extension): BM25 postings read per query term, highest "
            "impact first, exact for terms in fewer chunks; a more frequent term has its "
            "lowest-impact postings skipped (docs/benchmarks.md)"
        ),
    )
    bm25_exact: bool = Field(
        default=True,
        description=(
            "unfiltered full text is exact BM25 where the database has the "
            "`ragservice_bm25` extension (built by `make`; docs/operators.md); `false`: "
            "the budgeted statement (`RAGSERVICE_BM25_POSTINGS_PER_TERM`) always, a little "
            "less quality and, at a million"
            " chunks, no faster (p95 48.8 against exact 42.5 ms; docs/benchmarks.md)"
        ),
    )

    def ef_search_by_storage(self) -> dict[str, int]:
        """The HNSW ef_search of each vector storage: `hnsw_ef_search_<storage>`, else
        `hnsw_ef_search` (one value for all, as before), else `DEFAULT_EF_SEARCH`."""
        return {
            storage: getattr(self, f"hnsw_ef_search_{storage}") or self.hnsw_ef_search or default
            for storage, default in DEFAULT_EF_SEARCH.items()
        }


class AnsweringSettings(SettingsGroup):
    """From search results to an answer: rerank, context, prompt, the answer's HTML and links."""

    reranker: str | None = Field(
        default=None,
        description=(
            "a sentence-transformers cross-encoder (name or local path), or "
            "`NAME:VERSION` of one trained by `ragservice finetune --reranker` "
            "(docs/feedback.md), that rescores search results before answering; unset: no"
            " reranking"
        ),
    )
    rerank_candidates: int = Field(
        default=30,
        ge=1,
        le=1000,
        description="search results the reranker rescores (it keeps `k`)",
    )
    context_max_tokens: int = Field(
        default=1500,
        ge=16,
        description=(
            "token budget of the sources handed to the inference layer (counted with the "
            "embedding model's tokenizer)"
        ),
    )
    context_neighbours: int = Field(
        default=0,
        ge=0,
        le=5,
        description=(
            "chunks added on each side of a retrieved chunk for continuity, while the budget allows"
        ),
    )
    system_prompt: str | None = Field(
        default=None,
        description=(
            "the instructions sent to the model (answer from the numbered sources, cite "
            "them as [n]); unset: the built-in prompt"
        ),
    )
    link_hosts: str = Field(
        validation_alias="answer_link_hosts",
        default="",
        description=(
            "comma-separated hosts that links and images in answers may point to "
            "(subdomains included); others are removed, their text kept"
        ),
    )
    html: Literal["strip", "escape", "keep"] = Field(
        validation_alias="answer_html",
        default="strip",
        description=(
            "HTML in answers and chat `Sources:` titles: `strip` (nh3 takes out script, "
            "style, svg, iframe, images, event handlers; safe formatting tags and all "
            "Markdown stay), `escape` (tags shown as text) or `keep`"
        ),
    )
    chat_sources_block: bool = Field(
        default=True,
        description=(
            "end `/v1/chat/completions` answers with a `Sources:` list (a request's "
            "`sources_block` overrides it; `citations` carry the sources either way)"
        ),
    )

    def link_host_names(self) -> frozenset[str]:
        """`RAGSERVICE_ANSWER_LINK_HOSTS` as lower-case host names."""
        hosts = (host.strip().lower().rstrip(".") for host in self.link_hosts.split(","))
        return frozenset(host for host in hosts if host)


class InferenceSettings(SettingsGroup):
    """The upstream OpenAI-compatible server that writes answers."""

    url: str | None = Field(
        validation_alias="inference_url",
        default=None,
        description=(
            "an OpenAI-compatible base URL (vLLM, TGI, Ollama, OpenAI: e.g. "
            "`http://localhost:8001/v1`); unset: extractive answers (the best passages "
            "with citations)"
        ),
    )
    model: str = Field(
        validation_alias="inference_model",
        default="default",
        description="the model name sent upstream",
    )
    api_key: SecretStr | None = Field(
        validation_alias="inference_api_key",
        default=None,
        description=(
            "the upstream bearer key (sent only over https, or plain http to this "
            "machine: the service refuses to start otherwise)"
        ),
    )
    connect_timeout: float = Field(
        validation_alias="inference_connect_timeout",
        default=5.0,
        gt=0,
        description=(
            "upstream connect timeout in seconds (one call never takes longer than "
            "connect + read timeout, retries included)"
        ),
    )
    read_timeout: float = Field(
        validation_alias="inference_read_timeout",
        default=60.0,
        gt=0,
        description=(
            "upstream read timeout in seconds (one call never takes longer than connect +"
            " read timeout, retries included)"
        ),
    )
    max_retries: int = Field(
        validation_alias="inference_max_retries",
        default=2,
        ge=0,
        le=10,
        description=(
            "retries on connection errors, 429 and 5xx, with backoff honouring `Retry-After`"
        ),
    )
    max_tokens: int = Field(
        validation_alias="inference_max_tokens",
        default=512,
        ge=1,
        description="tokens an answer may have unless the caller asks otherwise",
    )
    temperature: float = Field(
        validation_alias="inference_temperature",
        default=0.1,
        ge=0,
        le=2,
        description="sampling temperature unless the caller asks otherwise",
    )


class CacheSettings(SettingsGroup):
    """The semantic prompt cache."""

    enabled: bool = Field(
        validation_alias="cache_enabled",
        default=True,
        description="the semantic prompt cache of `/v1/query` and `/v1/chat/completions`",
    )
    similarity_threshold: float = Field(
        validation_alias="cache_similarity_threshold",
        default=0.90,
        ge=0,
        le=1,
        description=(
            "cosine similarity a reworded question needs to be served a cached answer "
            "(then the meaning guard decides)"
        ),
    )
    ttl_seconds: int = Field(
        validation_alias="cache_ttl_seconds",
        default=86400,
        ge=1,
        description=(
            "lifetime of a cached answer from its creation (hits do not extend it); a "
            "collection may set its own (`cache_ttl_seconds`)"
        ),
    )
    purge_seconds: float = Field(
        validation_alias="cache_purge_seconds",
        default=300.0,
        gt=0,
        description="how often expired entries are deleted (they are never served meanwhile)",
    )
