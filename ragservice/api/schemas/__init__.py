"""Request and response bodies of the REST API (they are the OpenAPI schema at /docs), one
module per resource; `common` holds the error body and what the others share.

Each module also holds the functions that build its response models from the service's own
objects (`job_out`, …), so that every router shapes a resource the same way. The documents the
CLI prints too — a search's hits, an answer — are the service layer's (`services/views.py`),
named here by the modules that send them. Import from the resource's module:
`from ragservice.api.schemas.search import SearchRequest`.
"""
