#!/usr/bin/env python3
"""Tests of scripts/lib/demo_check.py, the check scripts/demo.sh ends with:
on made-up outputs, it passes a complete one and fails one with a gap, a
duplicate, a changed or a missing row, and measures the takeover from the
first row that could not have been computed before the kill."""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_check  # noqa: E402


def row(seq, end, auction=7, num=3):
    return {"_seq": seq, "_time": end - 1, "auction": auction, "num": num,
            "window_start": end - 10000, "window_end": end}


class DemoCheck(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        # The engine's rows: windows ending every 2 s; the last one is
        # closed by no bid (window_end after UNTIL).
        self.engine = [row(i, 2000 * (i + 1)) for i in range(6)]
        self.until = 10000  # closes windows ending 2000 .. 10000: five rows
        self.engine_path = self.write("engine.ndjson", "".join(json.dumps(r) + "\n" for r in self.engine))
        # The reference numbers its rows 1.. like a broker's stream.
        self.reference = [dict(r, _seq=r["_seq"] + 1) for r in self.engine[:5]]
        self.reference_path = self.write("ref.ndjson", "".join(json.dumps(r) + "\n" for r in self.reference))

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def run_check(self, received, *extra):
        """received: [(arrival time, row)]; returns (exit status, printed text)."""
        path = self.write("out.tsv", "".join("%.3f\t%s\n" % (t, json.dumps(r)) for t, r in received))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = demo_check.main(["check", path, "--reference", self.reference_path,
                                      "--engine", self.engine_path, "--until", str(self.until)] + list(extra))
        return status, out.getvalue()

    def received(self):
        return [(100.0 + i, dict(r)) for i, r in enumerate(self.reference)]

    def test_expected_counts_the_engine_rows_closed_by_the_last_bid(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            demo_check.main(["expected", self.engine_path, str(self.until)])
        self.assertEqual(out.getvalue().strip(), "5")

    def test_a_complete_output_passes(self):
        status, text = self.run_check(self.received())
        self.assertEqual(status, 0, text)
        self.assertIn("PASS: 5 rows (_seq 1..5), no gap, no duplicate", text)

    def test_a_gap_fails(self):
        got = self.received()
        del got[2]
        status, text = self.run_check(got)
        self.assertEqual(status, 1)
        self.assertIn("gap: _seq 3 to 3 missing", text)
        self.assertIn("4 rows received, 5 in", text)
        self.assertIn("FAIL", text)

    def test_a_duplicate_fails(self):
        got = self.received()
        got.insert(3, got[2])
        status, text = self.run_check(got)
        self.assertEqual(status, 1)
        self.assertIn("_seq 3 received 2 times", text)
        self.assertIn("extra 1x", text)

    def test_a_changed_row_fails_even_numbered_right(self):
        got = self.received()
        got[1][1]["num"] = 4
        status, text = self.run_check(got)
        self.assertEqual(status, 1)
        self.assertIn("missing 1x", text)
        self.assertIn("extra 1x", text)
        self.assertNotIn("gap", text)

    def test_takeover_counts_from_the_kill_to_the_first_row_no_one_had_before_it(self):
        got = self.received()  # rows arrive at 100, 101, ... 104
        # Killed at 101.5 with bids up to event time 6500 sent: the row of
        # the window ending 6000 (arriving at 102) may have been computed
        # before the kill; the one ending 8000 (at 103) was not.
        status, text = self.run_check(got, "--kill-at", "101.5", "--closed-by", "6500")
        self.assertEqual(status, 0, text)
        self.assertIn("takeover: 1.50 s", text)

    def test_no_new_row_after_the_kill_fails(self):
        got = self.received()[:3]  # rows up to the window ending 6000
        status, text = self.run_check(got, "--kill-at", "101.5", "--closed-by", "6500")
        self.assertEqual(status, 1)
        self.assertIn("no row computed after the kill was received", text)

    def summary_of(self, got):
        path = os.path.join(self.dir.name, "summary.json")
        self.run_check(got, "--summary", path)
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    def test_the_summary_counts_rows_lost_and_duplicated(self):
        self.assertEqual(self.summary_of(self.received()), {"rows": 5, "lost": 0, "duplicated": 0})
        got = self.received()
        del got[2]
        self.assertEqual(self.summary_of(got), {"rows": 4, "lost": 1, "duplicated": 0})
        got = self.received()
        got.insert(3, got[2])
        self.assertEqual(self.summary_of(got), {"rows": 6, "lost": 0, "duplicated": 1})

    def test_plain_ndjson_without_arrival_times_is_checked_too(self):
        path = self.write("plain.ndjson", "".join(json.dumps(r) + "\n" for r in self.reference))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = demo_check.main(["check", path, "--engine", self.engine_path, "--until", str(self.until)])
        self.assertEqual(status, 0, out.getvalue())


class DemoCheckInOrder(unittest.TestCase):
    """q8's check: the engine's rows below an event time, in order."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        # Pairs at event times 10, 10, 20, 30; the one at 30 not yet emitted
        # (every input's watermark at 30).
        self.engine = [{"_seq": i, "_time": t, "id": i, "reserve": 5} for i, t in enumerate([10, 10, 20, 30])]
        self.engine_path = os.path.join(self.dir.name, "q8.ndjson")
        with open(self.engine_path, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(r) + "\n" for r in self.engine))

    def tearDown(self):
        self.dir.cleanup()

    def run_check(self, rows):
        path = os.path.join(self.dir.name, "out.tsv")
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join("%.3f\t%s\n" % (100.0 + i, json.dumps(dict(r, _seq=i + 1))) for i, r in enumerate(rows)))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = demo_check.main(["check", path, "--engine-before", self.engine_path, "--before", "30",
                                      "--in-order"])
        return status, out.getvalue()

    def test_expected_before_counts_the_rows_below_the_time(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            demo_check.main(["expected-before", self.engine_path, "30"])
        self.assertEqual(out.getvalue().strip(), "3")

    def test_the_rows_in_order_pass(self):
        status, text = self.run_check(self.engine[:3])
        self.assertEqual(status, 0, text)
        self.assertIn("PASS: 3 rows (_seq 1..3), no gap, no duplicate, equal to the engine's rows (_time < 30), "
                      "in order", text)

    def test_the_same_rows_in_another_order_fail(self):
        status, text = self.run_check([self.engine[1], self.engine[0], self.engine[2]])
        self.assertEqual(status, 1, text)
        self.assertIn("in order: row 1 is", text)


if __name__ == "__main__":
    unittest.main()
