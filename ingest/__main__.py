"""`python -m ingest PATH... --collection NAME`: the same command as `ragservice ingest`."""

from ragservice.cli.ingest import main

main()
