"""Request and response bodies of the REST API (they are the OpenAPI schema at /docs), one
module per resource; `common` holds the error body and what the others share.

Each module also holds the functions that build its response models from the service's own
objects (`job_out`, `answer_out`, …), so that every router shapes a resource the same way.
Import from the resource's module: `from ragservice.api.schemas.search import SearchRequest`.
"""
