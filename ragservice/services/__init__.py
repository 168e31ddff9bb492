"""The service layer: what the service does (search, answer, ingest, jobs, documents),
called alike by every interface — the REST routers, the CLI's local mode and the console's
endpoints. A function here resolves options, filters and the cache scope, and opens the
transactions it needs; an interface only translates its own inputs and outputs."""
