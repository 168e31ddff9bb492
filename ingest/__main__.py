"""`python -m ingest PATH... --collection NAME`: the same command as `ragservice ingest`."""

from ingest.cli import main

main()
