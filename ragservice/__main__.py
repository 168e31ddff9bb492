"""`python -m ragservice ...`: the same command as `ragservice ...`."""

from ragservice.cli import main

main(prog_name="ragservice")
