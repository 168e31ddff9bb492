"""The `ragservice` command: serve, worker, ingest, keys, export-feedback, finetune, reembed,
models, analysts, db upgrade, replicas, dev-cluster.

One module per command group (`keys`, `db`, `replicas`, `embedding_models` for `models`,
`training`, `feedback`, `analysts`, `serve`, `ingest`), helpers they share in `common`, the
root app in `root`.
"""

from ragservice.cli.root import app, main

__all__ = ["app", "main"]
