#!/usr/bin/env python3
"""Moving a stateful fragment between nodes (docs/cluster.md, "Moving a
fragment"): the pause of each move as the fragment's state grows.

Per --state-mb size (default 1, 10 and 100), a fresh domain of three nodes
n1..n3 (its own etcd, certificates, peer links: the set-up of
scripts/bench-failover.py), stream "bids" led by n1 with factor 2, and a
query cut in two fragments: `a` (a filter keeping every bid) on n1, next to
bids, and `c` on n2, a count per bidder in one window of an hour, whose
state grows with the number of bidders. The bench publishes distinct
bidders until the state of `c` (its box's state_bytes in GET
/v1/queries/q) reaches the size, then, while a publisher keeps appending
100 bids every 20 ms, moves `c` --moves times between n2 and n3 (POST
/v1/queries/q/fragments/c/move through n1) and records each answer:
pause_ms (from the fragment's stop on one node to its run on the other)
and the steps. One JSON line per size:
  {"bench":"fragment_move_pause_ms","state_mb":..,"state_bytes":..,
   "moves":N,"p50":..,"max":..,"total_p50":..,"take_over_p50":..,
   "steps_p50":{each step of the answer},"warm_standbys":N,"target_ms":50}
(warm_standbys: the moves whose target warmed a standby before the
pause).
At the end the counts of `c`'s output must add up to every bid published
(the window closes with an end marker): {"bench":"fragment_move_check",...}.

With --hosted, a second domain "beta" of one node (its own CA, pinned by
each side, peer links both ways) hosts `c` under a hosting contract that
the two admins negotiate over REST first; the moves alternate between
beta/n1 (docs/cluster.md, "Moving a fragment to another domain") and back
to n2 (the take-back), and the lines are
  {"bench":"fragment_hosted_move_pause_ms",...,"steps_p50":{stop, run_call,
   host, host_catch_up},"warm":N,"target_ms":50}
  {"bench":"fragment_take_back_ms",...}
(warm: the moves whose host built a standby before the pause).

  scripts/bench-move.py [--state-mb 1,10,100] [--moves 10] [--hosted] [--build build]
Exit status 1 when a move fails or the check does not add up; 77 when etcd
is not installed.
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("bench_failover", os.path.join(HERE, "bench-failover.py"))
bf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bf)

SCHEMA = [{"name": "auction", "type": "int64"}, {"name": "bidder", "type": "int64"},
          {"name": "price", "type": "int64"}, {"name": "date_time", "type": "timestamp"}]
T0 = 1_000_000  # event time of every bid: all in the window [0, 1 h)


def query():
    return {
        "name": "q",
        "inputs": [{"name": "bids", "event_time": "date_time", "schema": SCHEMA}],
        "boxes": [
            {"id": "keep", "type": "filter", "options": {"predicates": ["price >= 0"], "drop_unmatched": True}},
            {"id": "per_bidder", "type": "aggregate", "options": {
                "group_by": ["bidder"], "window": {"type": "tumbling", "size": "1h"},
                "aggregates": [{"fn": "count", "as": "n"}]}},
        ],
        "arcs": [{"from": "bids", "to": "keep"}, {"from": "keep", "to": "per_bidder"}],
        "outputs": [{"name": "per-bidder", "from": "per_bidder"}],
        "placement": {"fragments": [{"name": "a", "node": "n1", "boxes": ["keep"]},
                                    {"name": "c", "node": "n2", "boxes": ["per_bidder"]}]},
    }


def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class Bench(bf.Bench):
    def __init__(self, args):
        super().__init__(args)
        self.published = 0
        self.lock = threading.Lock()
        self.links = {}  # --hosted: node name -> its federation port
        self.beta = None

    def node_config(self, node, config):
        """--hosted: fixed link ports, and each domain's peers with the
        other's pinned CA; beta/n1, a domain of one node, without etcd."""
        if not self.args.hosted:
            return config
        certs = os.path.join(self.dir, "certs")
        fed = config["federation"]
        fed["listen"] = "127.0.0.1:%d" % self.links[node.name]
        if node.name != "beta-n1":
            fed["peers"] = [{"domain": "beta", "ca_file": certs + "/beta-ca/ca.crt",
                             "nodes": [{"node": "n1", "address": "127.0.0.1:%d" % self.links["beta-n1"]}]}]
            return config
        config["domain"], config["node"] = "beta", "n1"
        del config["cluster"]
        fed["ca_file"] = certs + "/beta-ca/ca.crt"
        fed["peers"] = [{"domain": "bench", "ca_file": certs + "/ca/ca.crt",
                         "nodes": [{"node": n, "address": "127.0.0.1:%d" % self.links[n]}
                                   for n in ("n1", "n2", "n3")]}]
        return config

    def start_domain(self, etcd_bin):
        if not self.args.hosted:
            return super().start_domain(etcd_bin)
        for n in ("n1", "n2", "n3", "beta-n1"):
            self.links[n] = bf.free_port()
        certs = os.path.join(self.dir, "certs")
        self.certs("init-domain", "beta", "--out", certs + "/beta-ca")
        self.certs("issue-node", "beta", "n1", "--ca", certs + "/beta-ca", "--san", "127.0.0.1,localhost",
                   "--out", certs + "/beta-n1")
        super().start_domain(etcd_bin)
        self.beta = bf.Node(self, "beta-n1")
        self.beta.start()

    def contract(self):
        """acme (domain "bench") proposes hosting terms, beta accepts,
        bench countersigns: the id once n2, where c runs, holds it active."""
        terms = {"kind": "hosting", "host": "beta", "owner": "bench", "box_kinds": ["aggregate"],
                 "max_load": 1000000, "price_min": 1, "price_max": 2, "notice_seconds": 60,
                 "host_may_subscribe": False, "host_may_export": False,
                 "valid_from": iso(time.time() - 60), "valid_until": iso(time.time() + 86400)}
        deadline = time.time() + 60
        while True:  # the peer links come up first
            status, text = self.nodes[0].request("POST", "/v1/contracts", json.dumps({"terms": terms}), timeout=10)
            if status == 201 or time.time() > deadline:
                break
            time.sleep(0.5)
        if status != 201:
            raise RuntimeError("proposing the hosting contract: %d %s" % (status, text))
        cid = json.loads(text)["id"]
        while time.time() < deadline:
            status, text = self.beta.request("POST", "/v1/contracts/%s/accept" % cid, json.dumps({"version": 1}),
                                             timeout=10)
            if status == 200:
                break
            time.sleep(0.2)
        if status != 200:
            raise RuntimeError("beta accepting the hosting contract: %d %s" % (status, text))
        while time.time() < deadline:
            status, text = self.nodes[1].request("GET", "/v1/contracts/" + cid, timeout=10)
            if status == 200 and json.loads(text).get("version") == 3:
                return cid
            time.sleep(0.2)
        raise RuntimeError("the hosting contract is not active on n2: %s" % text)

    def close(self):
        if self.beta and self.beta.alive():
            self.beta.kill()
        super().close()

    def post(self, rows):
        body = json.dumps(rows)
        for _ in range(100):
            try:
                status, text = self.nodes[0].request("POST", "/v1/streams/bids/tuples", body, timeout=30)
                if status == 200:
                    with self.lock:
                        self.published += len(rows)
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("publishing: no 200 after 100 tries")

    def state_bytes(self):
        status, text = self.nodes[0].request("GET", "/v1/queries/q", timeout=10)
        if status != 200:
            return 0
        for f in json.loads(text).get("fragments", []):
            if f["name"] == "c" and f.get("runner"):
                return sum(b.get("state_bytes", 0) for b in f["runner"]["boxes"])
        return 0

    def setup(self):
        self.start_domain(os.environ.get("ETCD", "/usr/bin/etcd"))
        spec = {"name": "bids", "schema": SCHEMA, "event_time": "date_time", "node": "n1", "replication": 2}
        status, text = self.nodes[0].request("POST", "/v1/streams", json.dumps(spec))
        if status != 201:
            raise RuntimeError("creating bids: %d %s" % (status, text))
        self.wait_in_sync()
        status, text = self.nodes[0].request("POST", "/v1/queries", json.dumps(query()), timeout=60)
        if status != 201:
            raise RuntimeError("deploying the query: %d %s" % (status, text))
        self.wait_in_sync("q--c--state")

    def checkpoint(self):
        """Every node checkpoints its queries now (state_bytes is the last
        checkpoint's)."""
        for n in self.nodes:
            n.request("POST", "/v1/checkpoints", "", timeout=120)

    def load(self, want_bytes):
        """Distinct bidders until c's state holds want_bytes: a first
        batch gives the bytes per bidder, then the rest at once."""
        bidder, have = 0, 0
        for _ in range(5):
            per = have / bidder if bidder and have else 0
            n = 20000 if per == 0 else int((want_bytes - have) / per) + 1
            for start in range(bidder, bidder + n, 20000):
                count = min(20000, bidder + n - start)
                self.post([{"auction": 1, "bidder": start + k, "price": 1, "date_time": T0} for k in range(count)])
            bidder += n
            # Processed (c's input position caught up), then checkpointed.
            deadline = time.time() + 300
            while time.time() < deadline:
                status, text = self.nodes[0].request("GET", "/v1/queries/q", timeout=10)
                lag = sum(f["runner"].get("lag_tuples", 0) for f in json.loads(text).get("fragments", [])
                          if f.get("runner")) if status == 200 else 1
                if lag == 0:
                    break
                time.sleep(0.2)
            self.checkpoint()
            have = self.state_bytes()
            if have >= want_bytes:
                return have
        return have

    def run(self):
        a = self.args
        if not os.access(os.environ.get("ETCD", "/usr/bin/etcd"), os.X_OK):
            print("etcd is not installed: apt-get install etcd-server", file=sys.stderr)
            return 77
        self.setup()
        if a.hosted:
            self.contract()
        state = self.load(int(a.state_mb * 1e6))
        stop = threading.Event()

        def trickle():
            k = 0
            while not stop.is_set():
                self.post([{"auction": 2, "bidder": k % 1000, "price": 1, "date_time": T0} for _ in range(100)])
                k += 1
                time.sleep(0.02)

        pub = threading.Thread(target=trickle, daemon=True)
        pub.start()
        time.sleep(0.5)
        pauses, totals, takeovers, failures = [], [], [], 0
        backs, back_totals = [], []
        steps, warm = {}, 0
        where = "n2"
        for k in range(a.moves):
            if a.hosted:
                to = "beta/n1" if where == "n2" else "n2"
            else:
                to = "n3" if where == "n2" else "n2"
            status, text = self.nodes[0].request("POST", "/v1/queries/q/fragments/c/move",
                                                 json.dumps({"node": to}), timeout=120)
            if status != 200:
                failures += 1
                print("move %d to %s: %d %s" % (k + 1, to, status, text), file=sys.stderr)
                continue
            r = json.loads(text)
            if a.hosted and to == "n2":
                backs.append(r["pause_ms"])
            elif a.hosted:
                pauses.append(r["pause_ms"])
                totals.append(r["total_ms"])
                warm += 1 if r.get("warm") else 0
                for step, ms in r.get("steps_ms", {}).items():
                    steps.setdefault(step, []).append(ms)
            else:
                pauses.append(r["pause_ms"])
                totals.append(r["total_ms"])
                takeovers.append(r["steps_ms"]["take_over"])
                for step, ms in r["steps_ms"].items():
                    steps.setdefault(step, []).append(ms)
                warm += 1 if r.get("warm_standby") else 0
            where = to
            time.sleep(0.5)
        stop.set()
        pub.join()
        # The end marker closes the window (its own stays open: not
        # counted); every bid before it is counted once.
        want = self.published
        self.post([{"auction": -1, "bidder": -1, "price": 1, "date_time": T0 + 7_200_000}])
        counted, deadline = 0, time.time() + 300
        env = dict(os.environ, ENTENTE_TOKEN=bf.TOKEN)
        self.read_error = ""
        while time.time() < deadline:
            # Through the node that leads the output (GET says which).
            via = self.nodes[0]
            status, text = self.nodes[0].request("GET", "/v1/streams/per-bidder", timeout=10)
            if status == 200:
                leader = json.loads(text).get("node", "")
                via = next((n for n in self.nodes if n.name == leader and n.alive()), via)
            r = subprocess.run([self.entente, "subscribe", "--port", str(via.port), "--from", "1",
                                "--count", str(10 ** 7), "--timeout-ms", "20000", "per-bidder"],
                               capture_output=True, text=True, env=env)
            self.read_error = r.stderr.strip()[-300:]
            rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
            counted = sum(r["n"] for r in rows)
            if counted >= want:
                break
            time.sleep(1)
        if pauses and a.hosted:
            print(json.dumps({"bench": "fragment_hosted_move_pause_ms", "state_mb": a.state_mb,
                              "state_bytes": state, "moves": len(pauses), "p50": round(statistics.median(pauses), 1),
                              "max": round(max(pauses), 1), "total_p50": round(statistics.median(totals), 1),
                              "total_max": round(max(totals), 1),
                              "steps_p50": {k: round(statistics.median(v), 1) for k, v in steps.items()},
                              "steps_max": {k: round(max(v), 1) for k, v in steps.items()},
                              "warm": warm, "target_ms": 50}))
            if backs:
                print(json.dumps({"bench": "fragment_take_back_ms", "state_mb": a.state_mb, "moves": len(backs),
                                  "p50": round(statistics.median(backs), 1), "max": round(max(backs), 1)}))
        elif pauses:
            print(json.dumps({"bench": "fragment_move_pause_ms", "state_mb": a.state_mb, "state_bytes": state,
                              "moves": len(pauses), "p50": round(statistics.median(pauses), 1),
                              "max": round(max(pauses), 1), "total_p50": round(statistics.median(totals), 1),
                              "take_over_p50": round(statistics.median(takeovers), 1),
                              "steps_p50": {k: round(statistics.median(v), 1) for k, v in steps.items()},
                              "warm_standbys": warm, "target_ms": 50}))
        check = {"bench": "fragment_move_check", "state_mb": a.state_mb, "published": want, "counted": counted,
                 "exact": counted == want, "failed_moves": failures}
        if counted != want:
            check["read_error"] = self.read_error
        print(json.dumps(check))
        sys.stdout.flush()
        return 0 if failures == 0 and counted == want else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--state-mb", default="1,10,100")
    p.add_argument("--moves", type=int, default=10)
    p.add_argument("--hosted", action="store_true",
                   help="move to beta/n1, a node of another domain, under a hosting contract, and back")
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    args = p.parse_args()
    status = 0
    for mb in [float(x) for x in args.state_mb.split(",")]:
        ns = argparse.Namespace(state_mb=mb, moves=args.moves, hosted=args.hosted, build=args.build, lease_ttl=2,
                                factor=2,
                                durability="process", checkpoint_interval=60, query=True, chaos=0, kills=0,
                                pause_ms=2.0)
        b = Bench(ns)
        try:
            status = max(status, b.run())
        finally:
            b.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
