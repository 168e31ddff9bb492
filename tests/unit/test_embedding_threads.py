"""Several threads share one loaded model: ingest workers, chunking and queries at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ragservice.embedding.embedder import SentenceTransformerEmbedder


def test_embed_and_tokenize_from_many_threads(embedder: SentenceTransformerEmbedder) -> None:
    # Lengths from a few tokens to past 512, so batches pad and truncate; kept few: each thread
    # embeds all of them, and a long text costs the same whether or not threads race.
    texts = [f"sentence number {i} " * (1 + i * 40) for i in range(8)]
    expected = embedder.embed(texts)
    spans = embedder.tokenizer.token_spans(texts[-1])

    def work(i: int) -> bool:
        if i % 2:
            return bool(np.allclose(embedder.embed(texts), expected, atol=1e-5))
        return embedder.tokenizer.token_spans(texts[-1]) == spans

    with ThreadPoolExecutor(max_workers=6) as pool:
        assert all(pool.map(work, range(12)))
