#!/usr/bin/env python3
"""Failover of a stream's leader (docs/cluster.md, "Failover of a stream's
leader"): how long a replicated stream takes appends again after its leader
is killed with SIGKILL, over many kills, and whether anything acknowledged
was lost or stored twice.

Starts a domain of three nodes n1..n3 on this machine (its own etcd on free
loopback ports with a temporary data directory, the domain's CA and each
node's certificate from `entente certs`, a `cluster` and a `federation`
section per node), creates stream "bids" led by n1 with --factor copies,
and runs a publisher that appends one named batch at a time (producer "p",
numbers 1, 2, ...) through the live nodes in turn, sending a batch again
under the same number until it is acknowledged. Then, --kills times: waits
until every follower is in the in-sync set, kills the leader with SIGKILL,
and records
  detection   kill -> the leader's alive/ key gone from etcd (its lease expired)
  election    that -> the stream's catalog entry naming the new leader
  restore     that -> the first acknowledgement of a request sent after the kill
  takeover    kill -> the first acknowledgement of a request sent after the kill
(an etcd reader polls the two keys every 5 ms), restarts the killed node
(it discards its old log and copies the stream again as a follower), and
goes on. At the end the checker reads the leader's whole log (`entente
subscribe --from 1`): every acknowledged batch must be there exactly once,
in the order acknowledged, and nothing else.

etcd runs with --heartbeat-interval 50 --election-timeout 500 so that it
grants leases of 1 s (with its defaults the shortest lease is 2 s), and the
nodes with lease_ttl 1s (--lease-ttl). Prints one JSON line per figure:
{"bench":"failover_takeover_ms",...} with p50 and max of each part over the
kills, and {"bench":"failover_check",...} with what the checker found.
Exit status 1 when an acknowledged batch is missing or twice, or a kill is
not taken over within 30 s; 77 when etcd is not installed.

With --query (docs/cluster.md, "Failover of a query's fragments"): bids
carry an event time (the publisher's clock), and a query cut in two
fragments runs on them: `a` (a filter and a map to 7 buckets) on n1, next
to bids, and `c` (a stateful 100 ms tumbling count per bucket) on n2; a
subscriber (`entente subscribe` through n1, forwarded to the output's
leader, started again from its next sequence number when the connection
drops) records when each output row arrives. Each of the --kills rounds
kills the node running `c` (restarted afterwards: it drops its stale run
and follows), and records
  detection   kill -> the node's alive/ key gone from etcd
  election    that -> the fragment's state stream led by another node
  restore     that -> the first output row of a window that starts after
              the kill, at the subscriber (no tuple of it existed before
              the kill, so the new node computed it)
  takeover    kill -> that row
next to the same run's baseline: window start -> arrival of the rows of
windows no kill touched (a row can arrive only after its window ends, so
this is ~100 ms plus the pipeline's latency). The checker then requires the
output's sequence numbers without gap or repeat and the counts to add up to
every tuple acknowledged: {"bench":"failover_query_check",...}.

  scripts/bench-failover.py [--kills 20] [--factor 2] [--lease-ttl 1]
                            [--durability process|fsync] [--query] [--build build]
"""

import argparse
import base64
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

TOKEN = "bench-admin-token"
ROWS = 10


def free_port():
    # Below the ephemeral range, so no outgoing connection takes it.
    for _ in range(200):
        p = random.randint(10000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
                return p
            except OSError:
                continue
    raise RuntimeError("no free port")


def now_ms():
    return time.monotonic() * 1000.0


class Etcd:
    def __init__(self, binary, directory):
        self.dir = directory
        for _ in range(3):
            client, peer = free_port(), free_port()
            self.endpoint = "127.0.0.1:%d" % client
            shutil.rmtree(directory, ignore_errors=True)
            os.makedirs(directory)
            self.log = open(os.path.join(directory, "log"), "w")
            self.proc = subprocess.Popen(
                [binary, "--name=bench", "--data-dir=" + directory + "/data",
                 "--listen-client-urls=http://" + self.endpoint,
                 "--advertise-client-urls=http://" + self.endpoint,
                 "--listen-peer-urls=http://127.0.0.1:%d" % peer,
                 "--initial-advertise-peer-urls=http://127.0.0.1:%d" % peer,
                 "--initial-cluster=bench=http://127.0.0.1:%d" % peer,
                 "--initial-cluster-state=new",
                 "--heartbeat-interval=50", "--election-timeout=500"],
                stdout=self.log, stderr=subprocess.STDOUT)
            for _ in range(150):
                if self.proc.poll() is not None:
                    break
                try:
                    c = http.client.HTTPConnection(self.endpoint, timeout=1)
                    c.request("GET", "/health")
                    if b'"true"' in c.getresponse().read():
                        return
                except OSError:
                    pass
                time.sleep(0.1)
            self.proc.kill()
            self.proc.wait()
        raise RuntimeError("etcd did not start; see " + directory + "/log")

    def get(self, key, prefix=False, conn=None):
        body = {"key": base64.b64encode(key.encode()).decode()}
        if prefix:
            end = key[:-1] + chr(ord(key[-1]) + 1)
            body["range_end"] = base64.b64encode(end.encode()).decode()
        c = conn or http.client.HTTPConnection(self.endpoint, timeout=2)
        c.request("POST", "/v3/kv/range", json.dumps(body), {"Content-Type": "application/json"})
        d = json.loads(c.getresponse().read())
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode()
                for kv in d.get("kvs", [])}

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


class Node:
    def __init__(self, bench, name):
        self.bench, self.name = bench, name
        self.dir = os.path.join(bench.dir, name)
        os.makedirs(self.dir, exist_ok=True)
        self.proc = None
        self.port = 0

    def start(self):
        b = self.bench
        certs = os.path.join(b.dir, "certs")
        config = {
            "domain": "bench", "node": self.name,
            "cluster": {"etcd": ["http://" + b.etcd.endpoint], "lease_ttl": "%ds" % b.args.lease_ttl,
                        "etcd_timeout": "%dms" % (b.args.lease_ttl * 500)},
            "federation": {"listen": "127.0.0.1:0", "cert_file": "%s/%s/node.crt" % (certs, self.name),
                           "key_file": "%s/%s/node.key" % (certs, self.name),
                           "ca_file": "%s/ca/ca.crt" % certs},
            "api": {"listen": "127.0.0.1:0", "tls": False},
            "data_dir": os.path.join(self.dir, "data"),
            "tokens": [{"name": "bench", "role": "admin", "sha256": b.hash}],
            "ingest_durability": b.args.durability,
            "threads": {"network": 1, "engine": 1},
            "checkpoint_interval": "%ds" % b.args.checkpoint_interval,
        }
        # A bench built on this one may change it (another domain, peers).
        if hasattr(b, "node_config"):
            config = b.node_config(self, config)
        with open(os.path.join(self.dir, "node.json"), "w") as f:
            json.dump(config, f)
        self.port = 0  # the old port may belong to another process by now
        out = open(os.path.join(self.dir, "out"), "w")
        err = open(os.path.join(self.dir, "err"), "a")
        self.proc = subprocess.Popen([b.entente, "broker", "--config", os.path.join(self.dir, "node.json")],
                                     stdout=out, stderr=err)
        for _ in range(200):
            with open(os.path.join(self.dir, "out")) as f:
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", f.read())
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("node %s did not start; see %s/err" % (self.name, self.dir))

    def alive(self):
        return self.proc is not None and self.port != 0 and self.proc.poll() is None

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def pause(self):
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def request(self, method, target, body=None, timeout=3):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        headers = {"Authorization": "Bearer " + TOKEN}
        if body is not None:
            headers["Content-Type"] = "application/json"
        c.request(method, target, body, headers)
        r = c.getresponse()
        return r.status, r.read().decode()


class Publisher(threading.Thread):
    """One named batch at a time through the live nodes in turn; a batch
    is sent again under its number until it is acknowledged."""

    def __init__(self, bench):
        super().__init__(daemon=True)
        self.bench = bench
        self.acked = []      # batch numbers, in the order acknowledged
        self.ack_ms = []     # when each was acknowledged
        self.sent_ms = []    # when the request that was acknowledged was sent
        self.stop = False
        self.errors = {}
        self.lock = threading.Lock()

    def run(self):
        seq, turn = 1, 0
        while not self.stop:
            rows = [{"auction": seq * 1000 + k, "price": k} for k in range(ROWS)]
            if self.bench.args.query:
                t = int(time.time() * 1000)
                for r in rows:
                    r["date_time"] = t
            body = json.dumps(rows)
            live = [n for n in self.bench.nodes if n.alive()]
            turn += 1
            node = live[turn % len(live)] if live else None
            sent = now_ms()
            try:
                if node is None:
                    raise OSError("no node up")
                status, text = node.request("POST", "/v1/streams/bids/tuples?producer_id=p&producer_seq=%d" % seq,
                                            body, timeout=2)
            except (OSError, http.client.HTTPException) as e:
                status, text = 0, str(e)
            if status == 200:
                with self.lock:
                    self.acked.append(seq)
                    self.ack_ms.append(now_ms())
                    self.sent_ms.append(sent)
                seq += 1
                time.sleep(self.bench.args.pause_ms / 1000.0)
            else:
                key = str(status)
                self.errors[key] = self.errors.get(key, 0) + 1
                time.sleep(0.005)

    def first_ack_after(self, t):
        """When the first request sent after `t` was acknowledged (an answer
        in flight at `t` says nothing about the new leader)."""
        with self.lock:
            for a in range(len(self.sent_ms) - 1, -1, -1):
                if self.sent_ms[a] <= t:
                    return self.ack_ms[a + 1] if a + 1 < len(self.ack_ms) else None
            return self.ack_ms[0] if self.ack_ms else None


def cut_query():
    """bids -> keep (filter) -> bucket (map: auction % 7) -> counts (100 ms
    tumbling count per bucket); `a` = keep + bucket on n1, `c` = counts on n2."""
    schema = [{"name": "auction", "type": "int64"}, {"name": "price", "type": "int64"},
              {"name": "date_time", "type": "timestamp"}]
    return {
        "name": "q", "inputs": [{"name": "bids", "event_time": "date_time", "schema": schema}],
        "boxes": [
            {"id": "keep", "type": "filter", "options": {"predicates": ["price >= 0"], "drop_unmatched": True}},
            {"id": "bucket", "type": "map", "options": {"fields": [{"name": "bucket", "expr": "auction % 7"}]}},
            {"id": "counts", "type": "aggregate", "options": {
                "group_by": ["bucket"], "window": {"type": "tumbling", "size": "100ms"},
                "aggregates": [{"fn": "count", "as": "n"}]}}],
        "arcs": [{"from": "bids", "to": "keep"}, {"from": "keep", "to": "bucket"}, {"from": "bucket", "to": "counts"}],
        "outputs": [{"name": "counts", "from": "counts"}],
        "placement": {"fragments": [{"name": "a", "node": "n1", "boxes": ["keep", "bucket"]},
                                    {"name": "c", "node": "n2", "boxes": ["counts"]}]}}


class Subscriber(threading.Thread):
    """Follows the query's output through a node that is never killed (n1
    forwards the subscription to the output's leader); when the connection
    drops, subscribes again from the next sequence number. Keeps every row
    with the wall-clock time it arrived."""

    def __init__(self, bench, via):
        super().__init__(daemon=True)
        self.bench, self.via = bench, via
        self.rows = []  # (arrival wall ms, row)
        self.stop = False
        self.lock = threading.Lock()

    def run(self):
        env = dict(os.environ, ENTENTE_TOKEN=TOKEN)
        nxt = 1
        while not self.stop:
            # Through n1 unless it is down (a chaos round), then any node up.
            via = self.via if self.via.alive() else next((n for n in self.bench.nodes if n.alive()), None)
            if via is None:
                time.sleep(0.05)
                continue
            p = subprocess.Popen([self.bench.entente, "subscribe", "--port", str(via.port), "--from", str(nxt),
                                  "--timeout-ms", "2000", "counts"], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True, env=env)
            for line in p.stdout:
                if not line.strip():
                    continue
                row = json.loads(line)
                with self.lock:
                    self.rows.append((time.time() * 1000.0, row))
                nxt = row["_seq"] + 1
                if self.stop:
                    break
            p.kill()
            p.wait()
            time.sleep(0.01)

    def first_window_after(self, wall_ms):
        """When the first row of a window starting at or after `wall_ms` arrived."""
        with self.lock:
            for at, row in self.rows:
                if row["window_start"] >= wall_ms:
                    return at
        return None


class Bench:
    def __init__(self, args):
        self.args = args
        self.entente = os.path.join(args.build, "broker", "entente")
        self.dir = tempfile.mkdtemp(prefix="entente-bench-failover-")
        self.nodes = []
        self.etcd = None

    def certs(self, *argv):
        subprocess.run([self.entente, "certs", *argv], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    def entry(self, conn, stream="bids"):
        key = "/entente/bench/catalog/streams/" + stream
        v = self.etcd.get(key, conn=conn).get(key)
        return json.loads(v) if v else None

    def wait_in_sync(self, stream="bids", timeout_s=60):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            e = self.entry(None, stream)
            if e and len(e.get("in_sync", [])) == len(e.get("replicas", [])):
                return e
            time.sleep(0.05)
        raise RuntimeError("the followers of %s did not all join the in-sync set: %s" %
                           (stream, self.entry(None, stream)))

    def fragment_node(self, conn, fragment):
        key = "/entente/bench/catalog/queries/q"
        v = self.etcd.get(key, conn=conn).get(key)
        if not v:
            return None
        for f in json.loads(v)["fragments"]:
            if f["name"] == fragment:
                return f["node"]
        return None

    def run_query(self, pub, conn):
        a = self.args
        by_name = {n.name: n for n in self.nodes}
        sub = Subscriber(self, self.nodes[0])
        sub.start()
        time.sleep(3)  # the baseline's rows, before any kill
        wall = lambda: time.time() * 1000.0
        parts = {"detection": [], "election": [], "restore": [], "takeover": []}
        kill_walls = []
        failed = 0
        faults = {}
        for k in range(a.chaos):
            kill_walls.append(wall())
            kind = self.chaos_round(conn)
            faults[kind] = faults.get(kind, 0) + 1
        if a.chaos:
            print(json.dumps({"bench": "failover_query_chaos", "faults": a.chaos, "by_kind": faults,
                              "factor": a.factor, "lease_ttl_s": a.lease_ttl}))
        for k in range(a.kills):
            # The fragment's streams fail over together, once all are in sync.
            self.wait_in_sync("q--c--state")
            self.wait_in_sync("counts")
            victim = by_name[self.fragment_node(conn, "c")]
            time.sleep(0.5 + random.random() * 0.5)
            t_kill = wall()
            kill_walls.append(t_kill)
            victim.kill()
            t_gone = t_entry = t_row = None
            deadline = t_kill + 30000
            while wall() < deadline and (t_gone is None or t_entry is None or t_row is None):
                if t_gone is None and not self.etcd.get("/entente/bench/alive/" + victim.name, conn=conn):
                    t_gone = wall()
                if t_entry is None:
                    cur = self.entry(conn, "q--c--state")
                    if cur and cur["node"] != victim.name:
                        t_entry = wall()
                if t_row is None:
                    t_row = sub.first_window_after(t_kill)
                time.sleep(0.005)
            if t_row is None or t_entry is None or t_gone is None:
                failed += 1
                print("kill %d of %s: no new output within 30 s" % (k + 1, victim.name), file=sys.stderr)
            else:
                parts["detection"].append(t_gone - t_kill)
                parts["election"].append(max(0.0, t_entry - t_gone))
                parts["restore"].append(max(0.0, t_row - t_entry))
                parts["takeover"].append(t_row - t_kill)
            victim.start()
        pub.stop = True
        pub.join()
        # The end marker: an hour later, closes every window.
        last_event = int(wall())
        marker = json.dumps([{"auction": -1, "price": 0, "date_time": last_event + 3600000}])
        marker_acked = False
        for _ in range(300):
            live = [n for n in self.nodes if n.alive()]
            try:
                status, _ = live[0].request("POST", "/v1/streams/bids/tuples?producer_id=end&producer_seq=1", marker)
                if status == 200:
                    marker_acked = True
                    break
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.1)
        # Quiet for 10 s: everything is out (a fragment may be catching up).
        last, since = -1, wall()
        while wall() - since < 10000:
            with sub.lock:
                n = len(sub.rows)
            if n != last:
                last, since = n, wall()
            time.sleep(0.1)
        sub.stop = True
        with sub.lock:
            rows = [r for _, r in sub.rows]
            arrivals = list(sub.rows)
        base = [at - r["window_start"] for at, r in arrivals
                if all(abs(r["window_start"] - t) > 3000 for t in kill_walls) and r["window_start"] > 0]
        for name, xs in parts.items():
            if xs:
                print(json.dumps({"bench": "failover_query_ms", "part": name, "kills": len(xs),
                                  "p50": round(statistics.median(xs), 1), "max": round(max(xs), 1),
                                  "lease_ttl_s": a.lease_ttl, "factor": a.factor}))
        if base:
            print(json.dumps({"bench": "failover_query_ms", "part": "baseline_window_start_to_row",
                              "rows": len(base), "p50": round(statistics.median(base), 1),
                              "max": round(max(base), 1), "window_ms": 100}))
        seqs = [r["_seq"] for r in rows]
        gaps_or_repeats = sum(1 for i, x in enumerate(seqs) if x != i + 1)
        counted = sum(r["n"] for r in rows if r["bucket"] >= 0)
        want = len(pub.acked) * ROWS
        print(json.dumps({"bench": "failover_query_check", "kills": a.kills, "output_rows": len(rows),
                          "gaps_or_repeats": gaps_or_repeats, "counted_tuples": counted,
                          "acknowledged_tuples": want, "end_marker_acknowledged": marker_acked,
                          "last_window_start": max((r["window_start"] for r in rows), default=0) - last_event,
                          "publisher_retries": pub.errors}))
        return 1 if failed or gaps_or_repeats or counted != want else 0

    def controller(self, conn):
        return self.etcd.get("/entente/bench/controller", conn=conn).get("/entente/bench/controller", "")

    def chaos_round(self, conn):
        """One random fault (sometimes a second one while the domain recovers
        from the first), then waits until every node is back and every
        follower in sync."""
        e = self.wait_in_sync()
        by_name = {n.name: n for n in self.nodes}
        leader = by_name[e["node"]]
        followers = [by_name[r] for r in e["replicas"]]
        ctl = by_name.get(self.controller(conn))
        kinds = ["kill_leader", "kill_leader", "kill_follower", "kill_controller", "stop_any",
                 "stop_leader_past_lease"]
        fragment = None
        if self.args.query:
            # The node running the stateful fragment, once its state
            # stream's followers are in sync too.
            self.wait_in_sync("q--c--state")
            fragment = by_name.get(self.fragment_node(conn, "c"))
            kinds += ["kill_fragment", "kill_fragment", "stop_fragment_past_lease"]
        kind = random.choice(kinds)
        victim = {"kill_leader": leader, "kill_follower": random.choice(followers),
                  "kill_controller": ctl or leader, "stop_any": random.choice(self.nodes),
                  "stop_leader_past_lease": leader, "kill_fragment": fragment,
                  "stop_fragment_past_lease": fragment}[kind]
        time.sleep(random.random() * 0.5)
        if kind.startswith("kill"):
            victim.kill()
            down_for = random.random() * 3.0
        else:
            victim.pause()
            down_for = 2.0 if kind == "stop_any" else self.args.lease_ttl + 1.5
        second = None
        if random.random() < 0.3:
            # A second fault while recovering from the first: another node
            # stopped for 2 s.
            time.sleep(random.random() * 1.0)
            others = [n for n in self.nodes if n is not victim and n.alive()]
            if others:
                second = random.choice(others)
                second.pause()
                time.sleep(2.0)
                second.resume()
                kind += "+stop"
        time.sleep(max(0.0, down_for))
        if kind.startswith("kill"):
            victim.start()
        else:
            victim.resume()
        return kind

    def start_domain(self, etcd_bin):
        """Its etcd, the domain's CA and certificates, and n1..n3 started,
        until n1 lists the three up."""
        self.hash = subprocess.run([self.entente, "token-hash", TOKEN], check=True, capture_output=True,
                                   text=True).stdout.strip()
        self.etcd = Etcd(etcd_bin, os.path.join(self.dir, "etcd"))
        certs = os.path.join(self.dir, "certs")
        self.certs("init-domain", "bench", "--out", certs + "/ca")
        for n in ("n1", "n2", "n3"):
            self.certs("issue-node", "bench", n, "--ca", certs + "/ca", "--san", "127.0.0.1,localhost",
                       "--out", certs + "/" + n)
            self.nodes.append(Node(self, n))
        for n in self.nodes:
            n.start()
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                status, text = self.nodes[0].request("GET", "/v1/nodes")
                if status == 200 and text.count('"state":"up"') == 3:
                    break
            except OSError:
                pass
            time.sleep(0.1)

    def run(self):
        a = self.args
        etcd_bin = os.environ.get("ETCD", "/usr/bin/etcd")
        if not os.access(etcd_bin, os.X_OK):
            print("etcd is not installed (%s): apt-get install etcd-server" % etcd_bin, file=sys.stderr)
            return 77
        self.start_domain(etcd_bin)
        schema = [{"name": "auction", "type": "int64"}, {"name": "price", "type": "int64"}]
        spec = {"name": "bids", "schema": schema, "node": "n1", "replication": a.factor}
        if a.query:
            spec["schema"] = cut_query()["inputs"][0]["schema"]
            spec["event_time"] = "date_time"
        status, text = self.nodes[1].request("POST", "/v1/streams", json.dumps(spec))
        if status != 201:
            raise RuntimeError("creating bids: %d %s" % (status, text))
        self.wait_in_sync()
        if a.query:
            status, text = self.nodes[0].request("POST", "/v1/queries", json.dumps(cut_query()), timeout=30)
            if status != 201:
                raise RuntimeError("deploying the cut query: %d %s" % (status, text))
            self.wait_in_sync("q--c--state")
        pub = Publisher(self)
        pub.start()
        time.sleep(1)
        conn = http.client.HTTPConnection(self.etcd.endpoint, timeout=2)
        if a.query:
            return self.run_query(pub, conn)
        parts = {"detection": [], "election": [], "restore": [], "takeover": []}
        failed = 0
        faults = {}
        for k in range(a.chaos):
            kind = self.chaos_round(conn)
            faults[kind] = faults.get(kind, 0) + 1
        if a.chaos:
            print(json.dumps({"bench": "failover_chaos", "faults": a.chaos, "by_kind": faults,
                              "factor": a.factor, "lease_ttl_s": a.lease_ttl}))
        for k in range(a.kills):
            e = self.wait_in_sync()
            leader = next(n for n in self.nodes if n.name == e["node"])
            time.sleep(0.3 + random.random() * 0.4)  # a random point of the lease's renewal period
            t_kill = now_ms()
            leader.kill()
            t_gone = t_entry = t_ack = None
            deadline = t_kill + 30000
            while now_ms() < deadline and (t_gone is None or t_entry is None or t_ack is None):
                if t_gone is None and not self.etcd.get("/entente/bench/alive/" + leader.name, conn=conn):
                    t_gone = now_ms()
                if t_entry is None:
                    cur = self.entry(conn)
                    if cur and cur["node"] != leader.name:
                        t_entry = now_ms()
                if t_ack is None:
                    t_ack = pub.first_ack_after(t_kill)
                time.sleep(0.005)
            if t_ack is None or t_entry is None or t_gone is None:
                failed += 1
                print("kill %d of %s: not taken over within 30 s" % (k + 1, leader.name), file=sys.stderr)
            else:
                parts["detection"].append(t_gone - t_kill)
                parts["election"].append(max(0.0, t_entry - t_gone))
                parts["restore"].append(max(0.0, t_ack - t_entry))
                parts["takeover"].append(t_ack - t_kill)
            leader.start()
        pub.stop = True
        pub.join()
        for name, xs in parts.items():
            if not xs:
                continue
            print(json.dumps({"bench": "failover_takeover_ms", "part": name, "kills": len(xs),
                              "p50": round(statistics.median(xs), 1), "max": round(max(xs), 1),
                              "lease_ttl_s": a.lease_ttl, "factor": a.factor, "durability": a.durability}))
        # The checker.
        e = self.wait_in_sync()
        leader = next(n for n in self.nodes if n.name == e["node"])
        total = len(pub.acked) * ROWS
        env = dict(os.environ, ENTENTE_TOKEN=TOKEN)
        out = subprocess.run([self.entente, "subscribe", "--port", str(leader.port), "--from", "1",
                              "--count", str(2 * total + ROWS), "--timeout-ms", "3000", "bids"],
                             capture_output=True, text=True, env=env).stdout
        auctions = [json.loads(line)["auction"] for line in out.splitlines() if line.strip()]
        seen = {}
        for x in auctions:
            seen[x // 1000] = seen.get(x // 1000, 0) + 1
        missing = [b for b in pub.acked if seen.get(b, 0) == 0]
        twice = [b for b, c in seen.items() if c > ROWS]
        order = [x // 1000 for x in auctions[::ROWS]]
        in_order = order == sorted(order)
        extra = [b for b in seen if b not in set(pub.acked)]
        print(json.dumps({"bench": "failover_check", "kills": a.kills, "acked_batches": len(pub.acked),
                          "log_tuples": len(auctions), "missing": len(missing), "twice": len(twice),
                          "unacknowledged_in_log": len(extra), "in_order": in_order,
                          "publisher_retries": pub.errors}))
        if missing or twice or failed:
            print("missing %s twice %s" % (missing[:10], twice[:10]), file=sys.stderr)
            return 1
        return 0

    def close(self):
        for n in self.nodes:
            if n.alive():
                n.proc.terminate()
                n.proc.wait()
        if self.etcd:
            self.etcd.stop()
        if os.environ.get("KEEP"):
            print("kept " + self.dir, file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--chaos", type=int, default=0,
                   help="random faults before the kills: kill -9 of the leader, a follower or the controller, "
                        "SIGSTOP of any node for 2 s or of the leader past its lease, sometimes a second stop "
                        "while recovering")
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--lease-ttl", type=int, default=1, help="seconds")
    p.add_argument("--durability", default="process", choices=["process", "fsync"])
    p.add_argument("--pause-ms", type=float, default=2.0, help="between acknowledged batches")
    p.add_argument("--checkpoint-interval", type=int, default=1, help="seconds")
    p.add_argument("--query", action="store_true",
                   help="kill the node running a query's stateful fragment instead of the stream's leader")
    p.add_argument("--build", default=os.environ.get("BUILD_DIR", "build"))
    args = p.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    bench = Bench(args)
    try:
        return bench.run()
    finally:
        bench.close()


if __name__ == "__main__":
    sys.exit(main())
