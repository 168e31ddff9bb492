"""Questions over the real-document corpus, asked as a user asks them: is the first source of
each answer the right file, at the right page, slide or sheet?

The corpus (tests/realdocs: PDFs, HTML pages, EPUBs, e-mail, office files, spreadsheets that
nobody here wrote) is ingested with `ragservice ingest` into its own data directory (unchanged
files are skipped on a second run), a server is started on it (or `--url` names one), and
every question of tests/realdocs/*/questions.jsonl is sent to `POST /v1/query` (extractive
answers, no inference server). tests/realdocs/questions.py says how a citation is judged.

    .venv/bin/python benchmarks/realdocs_questions.py [--mode hybrid] [-k 5]

It prints each miss, a line per format, and a final JSON line: the share of questions whose
first citation names the right file (`top1_file`) and the right place too (`top1_place`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness
from tests.realdocs.questions import NOT_CORPUS, judge, questions
from tests.realdocs.sources import ROOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(".ragservice-realdocs"))
    parser.add_argument("--collection", default="realdocs")
    parser.add_argument("--mode", choices=("hybrid", "dense", "fulltext"), default="hybrid")
    parser.add_argument("-k", type=int, default=5)
    parser.add_argument("--url", help="a running server that holds the collection already")
    parser.add_argument("--api-key", default=os.environ.get("RAGSERVICE_API_KEY"))
    args = parser.parse_args()
    ingest_seconds = 0.0 if args.url else ingest(args.data_dir, args.collection)
    asked = questions()
    right_file: Counter[str] = Counter()
    right_place: Counter[str] = Counter()
    total: Counter[str] = Counter()
    started = time.perf_counter()
    with harness.server(args) as (base, headers), harness.connect(base, headers) as client:
        for question in asked:
            answer = client.answer(
                question.question, collections=[args.collection], mode=args.mode, k=args.k
            )
            cited = answer["citations"] or answer["sources"]
            first = dict(cited[0]) if cited else None
            verdict = judge(question, first)
            total[question.format] += 1
            right_file[question.format] += verdict.file
            right_place[question.format] += verdict.right
            if not verdict.right:
                where = first["cited_as"] if first else "(no source)"
                print(f"miss {question.id}: {question.file} {question.place} <- {where}")
    seconds = time.perf_counter() - started
    for name in sorted(total):
        print(
            f"{name:8s} {right_place[name]:3d}/{total[name]:3d} right place, "
            f"{right_file[name]:3d} right file"
        )
    count = sum(total.values())
    print(
        json.dumps(
            {
                "benchmark": "realdocs_questions",
                "mode": args.mode,
                "k": args.k,
                "questions": count,
                "top1_file": round(sum(right_file.values()) / count, 4),
                "top1_place": round(sum(right_place.values()) / count, 4),
                "per_format": {name: round(right_place[name] / total[name], 4) for name in total},
                "ingest_seconds": round(ingest_seconds, 1),
                "seconds_per_question": round(seconds / count, 3),
            }
        )
    )


def ingest(data_dir: Path, collection: str) -> float:
    """`ragservice ingest` of the corpus into `data_dir` (the project's own files left out)."""
    excluded = [arg for pattern in NOT_CORPUS for arg in ("--exclude", pattern)]
    command = [
        str(Path(sys.executable).parent / "ragservice"),
        "ingest",
        str(ROOT),
        "-c",
        collection,
        *excluded,
        "--json",
    ]
    env = {**os.environ, "RAGSERVICE_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"ingest failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    counts = json.loads(done.stdout)["counts"]
    print(f"ingested: {counts}")
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
