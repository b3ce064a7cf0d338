#!/usr/bin/env python3
"""Checks the output of `nexmark --dump DIR` independently of the C++ code.

Recomputes q2, q3, q4, q5, q7 and q8 from DIR/{persons,auctions,bids}.ndjson
with plain Python, following docs/nexmark.md, and compares with DIR/qN.ndjson
(q2 and q7 row for row and in order; the others as multisets, since their
order within a window follows the engine's key groups). q3 is compared with
NEXMark's *unbounded* join, which the windowed network must equal for this
generator. Meant for small dumps (a few hundred thousand events).

usage: check_dump.py DIR        exit status 0 if every present query matches
"""
import collections
import json
import os
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def q2(persons, auctions, bids):
    return [(b["auction"], b["price"]) for b in bids if b["auction"] % 123 == 0], \
        lambda r: (r["auction"], r["price"]), True


def q3(persons, auctions, bids):
    local = {p["id"]: p for p in persons if p["state"] in ("OR", "ID", "CA")}
    rows = [(local[a["seller"]]["name"], local[a["seller"]]["city"], local[a["seller"]]["state"], a["id"])
            for a in auctions if a["category"] == 10 and a["seller"] in local]
    return rows, lambda r: (r["name"], r["city"], r["state"], r["auction_id"]), False


def q4(persons, auctions, bids):
    by_id = {a["id"]: a for a in auctions}
    best = {}
    for b in bids:
        a = by_id.get(b["auction"])
        if a and a["date_time"] <= b["date_time"] <= a["expires"]:
            best[a["id"]] = max(best.get(a["id"], 0), b["price"])
    groups = collections.defaultdict(list)
    for auction, price in best.items():
        a = by_id[auction]
        groups[(a["expires"] // 10000, a["category"])].append(price)
    rows = [(c, (w + 1) * 10000, round(sum(v) / len(v), 6)) for (w, c), v in groups.items()]
    return rows, lambda r: (r["category"], r["window_end"], round(r["avg_price"], 6)), False


def q5(persons, auctions, bids):
    counts = collections.defaultdict(collections.Counter)
    for b in bids:
        pane = b["date_time"] // 2000
        for end_pane in range(pane + 1, pane + 6):  # the 5 windows of 10 s every 2 s holding it
            counts[end_pane * 2000][b["auction"]] += 1
    rows = []
    for end, c in counts.items():
        top = max(c.values())
        rows += [(a, n, end - 10000, end) for a, n in c.items() if n == top]
    return rows, lambda r: (r["auction"], r["num"], r["window_start"], r["window_end"]), False


def q7(persons, auctions, bids):
    windows = collections.defaultdict(list)
    for b in bids:
        windows[b["date_time"] // 10000].append(b)
    rows = []
    for w in sorted(windows):
        # The earliest bid with the highest price (bids are dumped in
        # event-time order; max() keeps the first of equal keys).
        b = max(windows[w], key=lambda b: b["price"])
        rows.append((b["auction"], b["price"], b["bidder"], b["date_time"]))
    return rows, lambda r: (r["auction"], r["price"], r["bidder"], r["date_time"]), True


def q8(persons, auctions, bids):
    by_id = {p["id"]: p for p in persons}
    rows = []
    for a in auctions:
        p = by_id.get(a["seller"])
        if p and p["date_time"] // 10000 == a["date_time"] // 10000:
            rows.append((p["id"], p["name"], a["reserve"]))
    return rows, lambda r: (r["id"], r["name"], r["reserve"]), False


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    d = sys.argv[1]
    persons, auctions, bids = (load(os.path.join(d, f + ".ndjson")) for f in ("persons", "auctions", "bids"))
    ok = True
    for name, fn in (("q2", q2), ("q3", q3), ("q4", q4), ("q5", q5), ("q7", q7), ("q8", q8)):
        path = os.path.join(d, name + ".ndjson")
        if not os.path.exists(path):
            continue
        expected, key, ordered = fn(persons, auctions, bids)
        got = [key(r) for r in load(path)]
        same = got == expected if ordered else collections.Counter(got) == collections.Counter(expected)
        print(f"{name}: {'ok' if same else 'DIFFERENT'} ({len(got)} rows, expected {len(expected)})")
        ok = ok and same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
