"""Choose ranking settings on one split: BM25 feedback (RM3), fusion and document scores.

    python benchmarks/ranking_sweep.py --data ../shared/data/scifact --split train \\
        [--data-dir .ragservice-eval] [--depth 200]

The corpus must already be in `--collection` (e.g. by `benchmarks/eval_beir.py`, which uses
`.ragservice-eval`; stop its server first). In process, read-only: each judged query is searched
once dense and once full text per BM25 variant (`Searcher`, `--depth` chunks each, as the HTTP
evaluation reads hybrid candidates), then every fusion and document-score setting is applied
to those lists by the service's own functions (`retrieval.fusion`), so a grid costs little.
Documents rank by `document_scores` (share 0: their best chunk). Prints, per part of the grid,
the settings best first by nDCG@10 (recall@100 beside), and a final JSON line with every row.
Make choices on train; look at test only to report them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

# Keep this folder off the import path: `benchmarks/ingest.py` would shadow the `ingest` package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from ragservice import store  # noqa: E402
from ragservice.config import Settings  # noqa: E402
from ragservice.db import tenancy  # noqa: E402
from ragservice.embedding.evaluation import (  # noqa: E402
    BeirQueries,
    load_beir_queries,
    mean,
    ndcg_at_k,
    recall_at_k,
)
from ragservice.retrieval.fusion import Fusion, FusionSpec, document_scores, fuse  # noqa: E402
from ragservice.retrieval.search import Mode, Searcher, SearchOptions  # noqa: E402
from ragservice.runtime import open_runtime  # noqa: E402

Side = list[tuple[str, str, float]]  # (chunk id, document external id, score), best first
BM25 = {"0.9/0.4": (0.9, 0.4), "1.2/0.75": (1.2, 0.75)}
PRF = {"off": None} | {
    f"rm3 d{d} t{t} q{q}": (d, t, q) for d, t, q in itertools.product((5, 10), (10, 20), (0.5, 0.7))
}
SHARES = (0.0, 0.1, 0.25, 0.5)


@dataclass(frozen=True)
class Lists:
    dense: dict[str, Side]
    text: dict[str, dict[str, Side]]  # text variant → query id → list


def main() -> None:
    args = _parse_args()
    queries = load_beir_queries(args.data, args.split)
    lists = _lists(args, queries)
    rows = _evaluate(lists, queries)
    _print(rows, args)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a BEIR dataset folder")
    parser.add_argument("--split", default="train")
    parser.add_argument("--data-dir", type=Path, default=Path(".ragservice-eval"))
    parser.add_argument("--collection", default=None, help="default: the dataset folder's name")
    parser.add_argument("--depth", type=int, default=200, help="chunks per side")
    parser.add_argument("--cache", type=Path, help="a JSON file keeping the lists between runs")
    args = parser.parse_args()
    args.collection = args.collection or args.data.resolve().name
    return args


# -- candidate lists -------------------------------------------------------------------------


def _lists(args: argparse.Namespace, queries: BeirQueries) -> Lists:
    if args.cache and args.cache.exists():
        cached = json.loads(args.cache.read_text())
        return Lists(cached["dense"], cached["text"])
    runtime = open_runtime(Settings(data_dir=args.data_dir))
    try:
        with tenancy.as_system():
            with runtime.db.read() as session:
                tenant = runtime.default_tenant_id
                found = store.collections.find_collection_id(session, tenant, args.collection)
            if found is None:
                raise SystemExit(f"collection {args.collection!r} not found: run eval_beir first")
            texts = list(queries.texts.values())
            vectors = dict(zip(texts, runtime.embedder.embed(texts), strict=True))
            searcher = Searcher(
                runtime.db,
                vectors.__getitem__,
                model_id=runtime.model_id,
                dimension=runtime.embedder.dimension,
            )
            with searcher:
                lists = _search_all(searcher, found, queries, args.depth)
    finally:
        runtime.close()
    if args.cache:
        args.cache.write_text(json.dumps({"dense": lists.dense, "text": lists.text}))
    return lists


def _search_all(
    searcher: Searcher, collection: uuid.UUID, queries: BeirQueries, depth: int
) -> Lists:
    base = SearchOptions(k=depth)

    def run(options: SearchOptions) -> dict[str, Side]:
        found = {}
        for query_id, text in queries.texts.items():
            hits = searcher.search(collection_ids=[collection], query=text, options=options).hits
            found[query_id] = [(str(h.chunk_id), h.external_id, h.score) for h in hits]
        return found

    dense = run(replace(base, mode=Mode.DENSE))
    text = {}
    for (bm25_name, (k1, b)), (prf_name, prf) in itertools.product(BM25.items(), PRF.items()):
        options = replace(base, mode=Mode.FULLTEXT, bm25_k1=k1, bm25_b=b)
        if prf is not None:
            docs, terms, weight = prf
            options = replace(
                options, prf=True, prf_docs=docs, prf_terms=terms, prf_query_weight=weight
            )
        text[f"{bm25_name} {prf_name}"] = run(options)
        print(f"searched full text {bm25_name} {prf_name}", file=sys.stderr)
    return Lists(dense, text)


# -- the grid --------------------------------------------------------------------------------


def _fusions() -> Iterator[tuple[str, FusionSpec]]:
    """Normalised over the first 100 candidates a side, as a search of k <= 100 reads."""
    for k in (10, 30, 60, 100):
        yield f"rrf{k}", FusionSpec(Fusion.RRF, rrf_k=k)
    for method, weight, adaptive in itertools.product(
        (Fusion.MINMAX, Fusion.ZSCORE, Fusion.DBSF), (0.3, 0.4, 0.5, 0.6), (False, True)
    ):
        label = f"{method.value} w{weight}{' adaptive' if adaptive else ''}"
        yield label, FusionSpec(method, text_weight=weight, adaptive=adaptive, depth=100)


def _evaluate(lists: Lists, queries: BeirQueries) -> list[dict[str, object]]:
    """Dense, every full-text variant, then hybrid: every fusion over plain BM25 and over the
    best feedback variant (share 0), then every share for the best few hybrid rows."""
    rows = [_row(queries, "dense", "dense", lists.dense, share) for share in SHARES]
    for variant, found in lists.text.items():
        rows += [_row(queries, "fulltext", variant, found, share) for share in SHARES]
    text_rows = [r for r in rows if r["part"] == "fulltext" and "share 0.0" in str(r["settings"])]
    best_prf = max(
        (r for r in text_rows if "rm3" in str(r["settings"])),
        key=lambda r: float(str(r["ndcg@10"])),
    )
    variants = [f"{bm25} off" for bm25 in BM25] + [str(best_prf["settings"]).split(" share")[0]]
    hybrid = []
    for variant, (label, spec) in itertools.product(variants, _fusions()):
        fused = {q: _fused(lists, lists.text[variant], q, spec) for q in queries.qrels}
        hybrid.append((_row(queries, "hybrid", f"{variant} {label}", fused, 0.0), fused))
    hybrid.sort(key=lambda pair: -float(str(pair[0]["ndcg@10"])))
    rows += [row for row, _ in hybrid]
    for row, fused in hybrid[:5]:
        label = str(row["settings"]).split(" share")[0]
        rows += [_row(queries, "hybrid", label, fused, share) for share in SHARES[1:]]
    return rows


def _row(
    queries: BeirQueries, part: str, label: str, lists: dict[str, Side], share: float
) -> dict[str, object]:
    ndcg, recall = [], []
    for query_id, qrels in queries.qrels.items():
        chunks = [(doc, score) for _, doc, score in lists[query_id]]
        docs = [doc for doc, _ in document_scores(chunks, share=share)]
        ndcg.append(ndcg_at_k(docs, qrels, 10))
        recall.append(recall_at_k(docs, qrels, 100))
    return {
        "part": part,
        "settings": f"{label} share {share}",
        "ndcg@10": round(mean(ndcg), 4),
        "recall@100": round(mean(recall), 4),
    }


def _fused(lists: Lists, text: dict[str, Side], query_id: str, spec: FusionSpec) -> Side:
    dense, found = lists.dense[query_id], text[query_id]
    documents = {chunk: doc for chunk, doc, _ in (*dense, *found)}
    fused = fuse([(c, s) for c, _, s in dense], [(c, s) for c, _, s in found], spec)
    return [(chunk, documents[chunk], score) for chunk, score in fused]


def _print(rows: Sequence[dict[str, object]], args: argparse.Namespace) -> None:
    for part in ("dense", "fulltext", "hybrid"):
        ranked = sorted(
            (r for r in rows if r["part"] == part), key=lambda r: -float(str(r["ndcg@10"]))
        )
        print(f"\n{part} ({args.split}), best first")
        for row in ranked[:25]:
            print(f"  {row['settings']:<60} {row['ndcg@10']:>8.4f} {row['recall@100']:>8.4f}")
    print(json.dumps({"split": args.split, "depth": args.depth, "rows": list(rows)}))


if __name__ == "__main__":
    main()
