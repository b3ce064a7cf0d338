#!/usr/bin/env python3
"""What scripts/demo.sh checks of a query's output read by a subscriber.

  demo_check.py expected ENGINE_Q5 UNTIL_MS
      prints how many rows of the engine's own q5 output (nexmark --dump)
      close by event time UNTIL_MS (window_end <= UNTIL_MS): the rows a
      broker's q5 emits once it has read bids up to that event time (its
      watermark), the rest waiting for later bids.

  demo_check.py expected-before ENGINE_OUTPUT BEFORE_MS
      prints how many rows of an engine output (NEXMark q8's) have an event
      time (_time) below BEFORE_MS: the rows a broker's join emits once
      every input's watermark has reached BEFORE_MS.

  demo_check.py check OUTPUT --reference FILE... [--engine ENGINE_Q5 --until MS]
                      [--engine-before ENGINE_OUTPUT --before MS --in-order]
                      [--kill-at EPOCH_S --closed-by MS]
      OUTPUT holds one line per row as the subscriber received it:
      "EPOCH_S<TAB>{json row}". Checks that its _seq run 1, 2, ... with no
      gap and no duplicate, and that its rows without _seq/_time equal, as a
      multiset, each reference (NDJSON rows, e.g. the same query's output in
      a fault-free run) and the engine's rows closed by UNTIL_MS (or, with
      --engine-before, the engine's rows whose _time is below --before;
      with --in-order, row for row in the engine's order too). With
      --kill-at (when a node was killed) and --closed-by (the latest event
      time of any input sent before the kill), prints the time from the kill
      to the first row received after it whose window ends after
      --closed-by: a row that no one could have computed before the kill.
      Prints one PASS or FAIL line with the counts; exit status 0 on PASS.
"""

import argparse
import collections
import json
import sys

_SYSTEM = ("_seq", "_time")


def row_key(row):
    """A row without the fields its stream numbers it with."""
    return tuple(sorted((k, v) for k, v in row.items() if k not in _SYSTEM))


def load_ndjson(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_received(path):
    """(arrival time in seconds, row) per line of a timestamped output; a
    line of plain NDJSON (no arrival time: JSON text holds no raw tab) gets 0."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            stamp, tab, body = line.rstrip("\n").partition("\t")
            out.append((float(stamp), json.loads(body)) if tab else (0.0, json.loads(stamp)))
    return out


def engine_rows(path, until_ms):
    return [r for r in load_ndjson(path) if r["window_end"] <= until_ms]


def rows_before(path, before_ms):
    return [r for r in load_ndjson(path) if r["_time"] < before_ms]


def seq_problems(rows):
    """The gaps and duplicates in the rows' _seq, which should be 1, 2, ..."""
    problems = []
    seen = collections.Counter(r["_seq"] for r in rows)
    for seq, n in sorted(seen.items()):
        if n > 1:
            problems.append("_seq %d received %d times" % (seq, n))
    expected = 1
    for seq in sorted(seen):
        if seq != expected:
            problems.append("gap: _seq %d to %d missing" % (expected, seq - 1) if seq > expected
                            else "_seq %d out of range" % seq)
        expected = seq + 1
    return problems


def multiset_diff(got, want):
    """Human-readable differences between two lists of rows, as multisets."""
    g = collections.Counter(row_key(r) for r in got)
    w = collections.Counter(row_key(r) for r in want)
    missing, extra = w - g, g - w
    out = []
    for k, n in list(missing.items())[:2]:
        out.append("missing %dx %s" % (n, dict(k)))
    for k, n in list(extra.items())[:2]:
        out.append("extra %dx %s" % (n, dict(k)))
    if len(missing) > 2 or len(extra) > 2:
        out.append("... %d rows missing, %d extra in all" % (sum(missing.values()), sum(extra.values())))
    return out


def takeover_s(received, kill_at, closed_by_ms):
    """Seconds from the kill to the first row after it that was not computable before it, or None."""
    for stamp, row in received:
        if stamp >= kill_at and row["window_end"] > closed_by_ms:
            return stamp - kill_at
    return None


def write_summary(path, rows, refs):
    """One JSON object for the demo's summary table: rows received, rows lost
    (missing from the fullest reference, or numbers skipped), rows duplicated
    (numbers received twice, or rows beyond the reference's)."""
    seen = collections.Counter(r["_seq"] for r in rows)
    duplicated = sum(n - 1 for n in seen.values())
    lost = (max(seen) - len(seen)) if seen else 0
    got = collections.Counter(row_key(r) for r in rows)
    for _, want in refs:
        w = collections.Counter(row_key(r) for r in want)
        lost = max(lost, sum((w - got).values()))
        duplicated = max(duplicated, sum((got - w).values()))
    with open(path, "w") as f:
        json.dump({"rows": len(rows), "lost": lost, "duplicated": duplicated}, f)
        f.write("\n")


def check(args):
    received = load_received(args.output)
    rows = [r for _, r in received]
    problems = ["%s: %s" % (args.output, p) for p in seq_problems(rows)]
    refs = [(path, load_ndjson(path)) for path in args.reference]
    if args.engine:
        refs.append(("the engine's q5 (window_end <= %d)" % args.until, engine_rows(args.engine, args.until)))
    if args.engine_before:
        want = rows_before(args.engine_before, args.before)
        name = "the engine's rows (_time < %d)" % args.before
        refs.append((name, want))
        if args.in_order:
            for i, (got, w) in enumerate(zip(rows, want)):
                if row_key(got) != row_key(w):
                    problems.append("against %s in order: row %d is %s, not %s" %
                                    (name, i + 1, dict(row_key(got)), dict(row_key(w))))
                    break
    for name, want in refs:
        problems += ["against %s: %s" % (name, p) for p in multiset_diff(rows, want)]
        if len(want) != len(rows):
            problems.append("%d rows received, %d in %s" % (len(rows), len(want), name))
    if args.kill_at is not None:
        t = takeover_s(received, args.kill_at, args.closed_by)
        if t is None:
            problems.append("no row computed after the kill was received")
        else:
            print("takeover: %.2f s from the kill to the subscriber's first new row" % t)
    seqs = [r["_seq"] for r in rows]
    span = "_seq %d..%d" % (min(seqs), max(seqs)) if seqs else "no rows"
    if args.summary:
        write_summary(args.summary, rows, refs)
    if problems:
        for p in problems:
            print("   " + p)
        print("FAIL: %d rows (%s), %d problems" % (len(rows), span, len(problems)))
        return 1
    print("PASS: %d rows (%s), no gap, no duplicate, equal to %s%s" %
          (len(rows), span, " and ".join(name for name, _ in refs), ", in order" if args.in_order else ""))
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("expected")
    e.add_argument("engine")
    e.add_argument("until", type=int)
    b = sub.add_parser("expected-before")
    b.add_argument("engine")
    b.add_argument("before", type=int)
    c = sub.add_parser("check")
    c.add_argument("output")
    c.add_argument("--reference", action="append", default=[])
    c.add_argument("--engine")
    c.add_argument("--until", type=int)
    c.add_argument("--engine-before")
    c.add_argument("--before", type=int)
    c.add_argument("--in-order", action="store_true")
    c.add_argument("--kill-at", type=float)
    c.add_argument("--closed-by", type=int)
    c.add_argument("--summary", help="write {rows, lost, duplicated} as JSON to this file")
    args = p.parse_args(argv)
    if args.cmd == "expected":
        print(len(engine_rows(args.engine, args.until)))
        return 0
    if args.cmd == "expected-before":
        print(len(rows_before(args.engine, args.before)))
        return 0
    if ((args.engine is None) != (args.until is None) or (args.kill_at is None) != (args.closed_by is None) or
            (args.engine_before is None) != (args.before is None) or (args.in_order and not args.engine_before)):
        p.error("--engine goes with --until, --engine-before with --before (and --in-order), "
                "--kill-at with --closed-by")
    return check(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
