"""Retrievers over the search API (`POST /v1/search`) for the frameworks apps are built with:
`ragservice.integrations.langchain` (the `langchain` extra) and
`ragservice.integrations.llamaindex` (the `llamaindex` extra). Each module imports its
framework; this package imports neither."""
