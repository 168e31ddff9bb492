"""Fault figures on demand, from the fault tests run against a real server and PostgreSQL.

    python benchmarks/faults.py [--runs 3] [-k postgres]

Runs `tests/e2e/test_faults.py` and `tests/e2e/test_embedded_supervision.py` (`--runs` times)
and collects the `FAULTS {json}` line each of their scenarios prints:

- `sigkill_mid_ingest`: a server killed with SIGKILL in the middle of a 30-document ingest job;
  documents committed before the kill, documents after the job was taken over and finished,
  half-written documents found after the kill and after the rerun, documents that differ from
  a clean ingest of the same texts;
- `sigkill_on_last_attempt`: the same with `RAGSERVICE_JOB_MAX_ATTEMPTS=1`: the job fails, and
  sending the same upload again completes it;
- `postgres_restart`: PostgreSQL stopped (`pg_ctl -m fast`) for 1 s and started again, three
  times, under a loop of searches: the time from each start to the first successful search,
  from each stop to it, and which statuses the failed searches got;
- `job_across_postgres_restart`: an ingest job running while PostgreSQL restarts: its status
  and attempts after, documents stored, half-written ones;
- `inference_upstream`: `/v1/query` while the upstream hangs past the read timeout, then while
  nothing listens on its port; `/v1/search` on the same server;
- `embedded_postmaster_killed`: the embedded server's postmaster killed with SIGKILL under a
  loop of searches and started again by the server's supervisor: the time from the kill to the
  first successful search, the supervisor's own gone-to-ready time, searches failed during the
  outage and after it (0).

Prints one block per scenario (numbers over several runs as median and all values; the
per-restart figures of every run pooled) and ends with one JSON line of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/e2e/test_faults.py", "tests/e2e/test_embedded_supervision.py"]
PREFIX = "FAULTS "
RUN_TIMEOUT_S = 600


def main() -> None:
    args = _parse_args()
    lines: list[dict[str, Any]] = []
    for run in range(args.runs):
        print(f"run {run + 1} of {args.runs}: pytest {' '.join(TESTS)}", file=sys.stderr)
        lines += _run_tests(args.k)
    summary = {name: _summarize(found) for name, found in _by_scenario(lines).items()}
    for name, figures in summary.items():
        print(f"\n{name}")
        for key, value in figures.items():
            print(f"  {key:32} {value}")
    print(json.dumps({name: _medians(figures) for name, figures in summary.items()}))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="times to run the test files")
    parser.add_argument("-k", default=None, help="pytest -k expression: only these scenarios")
    return parser.parse_args()


def _run_tests(expression: str | None) -> list[dict[str, Any]]:
    command = [sys.executable, "-m", "pytest", *TESTS, "-q", "-s", "-p", "no:cacheprovider"]
    if expression:
        command += ["-k", expression]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        sys.exit(f"the fault tests failed:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}")
    return [json.loads(line[len(PREFIX) :]) for line in _prefixed(done.stdout)]


def _prefixed(output: str) -> list[str]:
    # pytest -q -s prints a test's progress dot on the same line as the test's first print.
    return [line[line.index(PREFIX) :] for line in output.splitlines() if PREFIX in line]


def _by_scenario(lines: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        found.setdefault(line.pop("scenario"), []).append(line)
    return found


def _summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure over the runs; the per-restart list `each` becomes one list per figure."""
    pooled: dict[str, list[Any]] = {}
    for figures in runs:
        for key, value in figures.items():
            if key == "each":
                for restart in value:
                    for name, number in restart.items():
                        pooled.setdefault(f"{name} (each)", []).append(number)
            else:
                pooled.setdefault(key, []).append(value)
    return {key: _one(values) for key, values in pooled.items()}


def _one(values: list[Any]) -> Any:
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if numbers and len(values) > 1:
        return {"median": statistics.median(values), "values": values}
    return values[0] if len(values) == 1 else values


def _medians(figures: dict[str, Any]) -> dict[str, Any]:
    return {
        key: value["median"] if isinstance(value, dict) else value for key, value in figures.items()
    }


if __name__ == "__main__":
    main()
