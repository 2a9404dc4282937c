"""Fuzz benchmark: mutated records through the decoder under each bad-record policy, accounted for.

Generates `--records` records (`testbed.fuzz_records`: Debezium JSON with and without the Connect
schema block, flat op-coded JSON, Confluent Avro; truncated, invalid UTF-8, wrong types, missing
fields, huge values, deep nesting, wrong magic bytes, unknown schema ids, null keys and values,
...), decodes them as Kafka record batches (one per topic partition) with `ChangelogBatchDecoder`
under FAIL, LOG, SKIP and DEAD_LETTER, and accounts for every record (`testbed.fuzz_accounting`):
applied (change rows), a documented no-op (tombstone after a delete, logical message, ignored
truncate), or exactly one error row carrying its coordinates, policy and bytes. Prints one line
per policy; exits non-zero on any silent drop, wrong account or crash.

    .venv/bin/python bench/fuzz_benchmark.py                     # 10,000 records, seed 0
    .venv/bin/python bench/fuzz_benchmark.py --seed 994 --by-mutation
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `testbed`

from testbed.fuzz_accounting import Accounting, run  # noqa: E402
from testbed.fuzz_records import POLICIES, FuzzInput, generate  # noqa: E402

COLUMNS = ("policy", "records", "applied", "no-op", "failed w/ coordinates", "logged", "skipped", "dead-lettered",
           "silent drops", "wrong accounts", "crashes", "records/s (wall)", "records/s (CPU)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="runs per policy; the fastest is shown")
    parser.add_argument("--by-mutation", action="store_true", help="also print outcomes per mutation (DEAD_LETTER)")
    return parser.parse_args(argv)


def _line(accounting: Accounting) -> list[str]:
    outcomes = accounting.outcomes
    return [
        accounting.policy, f"{accounting.records:,}", f"{outcomes['applied']:,}", f"{outcomes['no-op']:,}",
        f"{outcomes['FAIL']:,}", f"{outcomes['LOG']:,}", f"{outcomes['SKIP']:,}", f"{outcomes['DEAD_LETTER']:,}",
        str(len(accounting.silent_drops)), str(len(accounting.wrong_accounts)), str(len(accounting.crashes)),
        f"{accounting.records / accounting.seconds:,.0f}", f"{accounting.records / accounting.cpu_seconds:,.0f}",
    ]


def _table(header: tuple[str, ...] | list[str], lines: list[list[str]]) -> str:
    rows = [list(header), ["---"] * len(header), *lines]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def _by_mutation(accounting: Accounting) -> str:
    mutations = sorted({mutation for mutation, _ in accounting.by_mutation})
    outcomes = [o for o in ("applied", "no-op", "FAIL", accounting.policy) if o != "FAIL" or accounting.policy != "FAIL"]
    lines = [[m, *(f"{accounting.by_mutation[(m, o)]:,}" for o in outcomes)] for m in mutations]
    return _table(["mutation", *outcomes], lines)


def _fastest(fuzz: FuzzInput, policy: str, repeat: int) -> Accounting:
    """The accounting of one run, timed as the fastest of `repeat` runs (all must agree)."""
    runs = [run(fuzz, policy)[0] for _ in range(max(repeat, 1))]
    first = runs[0]
    assert all(r.outcomes == first.outcomes for r in runs), f"{policy}: outcomes differ between runs"
    first.seconds = min(r.seconds for r in runs)
    first.cpu_seconds = min(r.cpu_seconds for r in runs)
    return first


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 1 when a record was not accounted for."""
    args = parse_args(argv)
    fuzz = generate(args.seed, args.records)
    mutated = sum(1 for record in fuzz.records if record.mutation != "none")
    print(f"{len(fuzz.records):,} records (seed {args.seed}), {mutated:,} mutated; "
          f"mutations: {dict(Counter(r.mutation for r in fuzz.records).most_common())}\n")
    results = [_fastest(fuzz, policy, args.repeat) for policy in POLICIES]
    print(_table(COLUMNS, [_line(accounting) for accounting in results]))
    if args.by_mutation:
        print("\n" + _by_mutation(results[POLICIES.index("DEAD_LETTER")]))
    problems = [line for accounting in results for line in accounting.problems()]
    for line in problems[:50]:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
