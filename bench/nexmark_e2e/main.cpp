// nexmark_e2e: NEXMark end to end through the broker, the figure a user of
// the product gets (docs/nexmark.md, "End to end through the broker").
//
//   nexmark_e2e --port P [--port P2 ...] [--host H] [--token T] [--tls --ca FILE]
//               [--events N] [--queries q5,q8] [--chunk N] [--seed S] [--window N]
//               [--repeat N] [--timeout S] [--inputs-only] [--node-pid PID ...]
//               [--cut [--move|--split|--split-throughput [--offered-rate EVENTS_PER_S]]]
//
// Per query, on the node(s) given:
//   1. the engine alone runs the query over the generated events in this
//      process (the baseline, measured in the same run: the machine is
//      noisy), keeping its output rows;
//   2. the bench creates the persons, auctions and bids streams, deploys the
//      query over the API, subscribes (binary WebSocket) to its output
//      stream, and publishes every event over one binary WebSocket publisher
//      per stream (durable ingest, producer-named batches), in the
//      generator's order: per chunk, persons, auctions, then bids;
//   3. the figure is events / (first publish .. the subscriber holds as many
//      output rows as the engine-only run produced); the rows must then equal
//      the engine-only rows one by one (values and event times).
// One JSON line per query. Exit status 1 when a query's rows differ, the
// output did not complete within --timeout, or the node refused something;
// 2 for bad arguments.
//
// Order. Each stream's events reach its log in the generator's order (one
// socket per stream, answered in order). Across the three streams the broker
// promises nothing (three logs, one group commit, a runner that reads its
// inputs round robin), and the query does not need it: a box with several
// inputs orders rows by event time, releasing them once every input's
// watermark has passed (docs/engine.md, "Determinism"), so the output is the
// same however the streams interleave.
//
// End of stream. The API has no "finish": windows close when the watermark
// passes them. After the events the bench publishes one end marker per
// stream, an hour of event time past the last event, with ids that match
// nothing (-1, -2, -3 for the ids and numbers of persons, auctions, bids;
// empty strings); its watermark closes every window that holds events. The engine-only run pushes the same markers and
// does not call finish(), so both runs compute the same thing.
//
// Nodes. Every request goes to an endpoint chosen by `Endpoints` (where to
// create, publish, deploy, subscribe). With one --port all go to that node.
// With several (the nodes of one domain, docs/cluster.md) the first port's
// node leads the three input streams (created with "node") and so runs the
// query, which the controller places next to its inputs; the query is
// deployed through the second node, stream s is published through node
// s mod N (persons through the first, auctions the second, bids the third)
// and the output is read through the last. Every call not made to the
// first node is forwarded by the node it reaches to the first: the figure
// is the cost of that relay, not of internal arcs (the query runs whole;
// --cut below cuts it). The bench checks that the query runs on the first
// node (every box's "placement" through every node) before it publishes.
//
// Cut (--cut, three ports). The query is cut into fragments on the three
// nodes (a "placement" of "fragments", docs/query-networks.md, "Cutting a
// query into fragments"), the arcs between fragments on different nodes
// internal streams over the nodes' peer links. Each input stream is led
// by its own node: persons by the first, auctions by the second, bids by the
// third, and published through its leader (stream s through node s, as
// above: no publish is forwarded). q5: `counts` (reads bids) on the third
// node, `hot` on the first; q8: `people` (persons) on the first, `sellers`
// (auctions) on the second, `new_users` on the third. The query is deployed
// through the second node (which deploys each fragment on its node) and the
// output is read through the node that runs the fragment writing it, the
// stream's leader (q5 the first, q8 the third): the figure holds the
// internal arcs and no relay. Before it publishes, the bench checks
// through every node that GET /v1/queries/{name} says "running" with every
// fragment on the node asked. The JSON line says "cut":true and the
// fragments with their nodes and boxes.
//
// Move (--cut --move). Once half the chunks are published, while the
// publishers go on, the stateful fragment that reads no input stream (q5's
// `hot`, q8's `new-users`) is moved to the next node (POST
// /v1/queries/{name}/fragments/{f}/move, docs/cluster.md, "Moving a
// fragment"); its output's subscriber, told that the stream is led
// elsewhere now (close 4010), resumes where it stopped. The rows must
// still equal the engine-only rows one by one. The JSON line adds
// "move": the move's answer; a move that does not answer 200 fails the run.
//
// Split (--cut --split). Once a third of the chunks are published, while
// the publishers go on, the query's keyed stateful fragment is split into
// two parts by key group (POST /v1/queries/{name}/fragments/{f}/split,
// parts on the two nodes other than the fragment's; docs/cluster.md,
// "Splitting a fragment"); once two thirds are published it is merged back
// (POST .../merge). Just before the merge the bench reads each part's
// count of tuples in (GET /v1/queries/{name}): both parts must have
// worked. The rows must still equal the engine-only rows one by one. The
// JSON line adds "split" and "merge": their answers (pause_ms, total_ms),
// the chunk each was asked at, and the parts' tuples. q5's fragment
// counts (on the leader of bids, writing the internal stream that hot
// reads) is split: each part's aggregate keeps its own best auctions of a
// window (`top`), the merge ranks them again and writes that internal
// stream on. q8's fragment new-users,
// its join, is split with a router per side (persons by id, auctions by
// seller). A refusal (409) still makes a line, which says
// "split":{"refused":STATUS,"problem":ANSWER} and no merge. The query
// `q5count` is q5 without its `top`: every auction's sliding count,
// placed whole on the third node (its one fragment `all`: counts and hot).
// A split or merge answered otherwise than 200 or 409 fails the run, and
// so does a refused merge.
//
// Split throughput (--cut --split-throughput [--offered-rate R]). What
// the keyed stage reads per second unsplit and split, in one run: the
// first half of the chunks with the fragment unsplit, then (once its keyed
// box has read every bid of that half) the split into two parts on the
// other two nodes, then the second half. Each half is published as fast as
// the nodes answer, or paced at R events a second (all three streams'),
// the same pace for both; a phase ends when the keyed box, or its copies
// in the parts together, has read all of the phase's bids (GET
// /v1/queries/{name} every 100 ms: a box's counters are read between its
// runner's runs, so a phase's end is seen a run and a poll late at most,
// never early). One line {"bench":"split_throughput","parts":1|2,...} per
// half: bids, publish_seconds, seconds, tuples_per_s (bids / seconds),
// catch_up_s (seconds after the last publish answer), each node's CPU
// seconds over the phase and CPU microseconds per bid, all nodes summed.
// The rows must still equal the engine-only rows; the split must answer
// 200 (q5count).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/bench_common.h"
#include "bench/nexmark/generator.h"
#include "bench/nexmark/runner.h"
#include "engine/codec.h"
#include "engine/network.h"
#include "http/client.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

using namespace entente;
using bench::Clock;
using engine::Batch;
using nexmark::Chunk;

namespace {

constexpr const char* kProg = "nexmark_e2e";
// q5 without its top (see "Split" above): the keyed stage the split takes.
constexpr const char* kQ5Count = "q5count";
constexpr int kStreams = 3;
enum StreamIndex : size_t { kPersons = 0, kAuctions = 1, kBids = 2 };  // into kStreamNames
const char* const kStreamNames[kStreams] = {"persons", "auctions", "bids"};
Batch Chunk::* const kStreamOf[kStreams] = {&Chunk::persons, &Chunk::auctions, &Chunk::bids};

struct Args {
  std::vector<bench::Node> nodes;  // one per --port
  bench::Node proto;               // --host, --token, --tls, --ca for every node
  uint64_t events = 2'000'000;
  uint32_t chunk = 8192;
  uint64_t seed = 1;
  int window = 16;         // messages in flight per publisher socket
  int repeat = 3;          // engine-only runs; the fastest counts
  double timeout_s = 300;  // for the whole output to arrive
  bool inputs_only = false;
  std::vector<int> node_pids;  // --node-pid, repeated: the nodes' processes, for their CPU time (same machine)
  bool cut = false;            // --cut: each query cut into fragments on the three nodes
  bool move = false;           // --move (with --cut): a fragment moved mid-stream
  bool split = false;          // --split (with --cut): a fragment split, then merged back, mid-stream
  bool split_throughput = false;  // --split-throughput (with --cut): the keyed stage's rate unsplit, then split
  double offered_rate = 0;         // --offered-rate: events per second the publisher paces --split-throughput at
  std::vector<std::string> queries = {"q5", "q8"};
};

// Which node each part of a run talks to. One node: all of them. A domain of
// several nodes answers every call for the whole domain (docs/cluster.md):
// the first node leads the inputs and runs the query, the others reach it
// by forwarding (see "Nodes" above). With --cut (three nodes) stream s is
// led by node s and the query's fragments are spread over the nodes (see
// "Cut" above); the output is then read through its fragment's node
// (run_e2e picks it per query).
class Endpoints final {
 public:
  Endpoints(std::vector<bench::Node> nodes, bool cut)
      : nodes_(std::move(nodes)), names_(nodes_.size()), cut_(cut && nodes_.size() == kStreams) {}
  size_t size() const { return nodes_.size(); }
  bool cluster() const { return nodes_.size() > 1; }
  bool cut() const { return cut_; }
  // The node that leads stream s (and so publishes it directly).
  size_t leader_index(int stream) const { return cut_ ? static_cast<size_t>(stream) : 0; }
  const bench::Node& admin() const { return nodes_[0]; }
  const bench::Node& deploy() const { return nodes_[cluster() ? 1 : 0]; }
  size_t publish_index(int stream) const { return static_cast<size_t>(stream) % nodes_.size(); }
  const bench::Node& publish(int stream) const { return nodes_[publish_index(stream)]; }
  const bench::Node& node(size_t i) const { return nodes_[i]; }

  // With several nodes: each port's node name and the domain, from
  // GET /v1/nodes ("self", "domain"), and a check that every node sees all
  // of them up.
  Status discover() {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      auto r = bench::call(nodes_[i], "GET", "/v1/nodes");
      if (!r.ok()) return make_error(Errc::io_error, "GET /v1/nodes: " + r.error().message);
      rapidjson::Document d;
      d.Parse(r->body.data(), r->body.size());
      if (r->status != 200 || d.HasParseError() || !d.IsObject() || !d.HasMember("self") || !d["self"].IsString() ||
          !d.HasMember("domain") || !d["domain"].IsString() || !d.HasMember("nodes") || !d["nodes"].IsArray())
        return make_error(Errc::invalid_argument, "port " + std::to_string(nodes_[i].port) +
                                                      " is not a node of a domain of several nodes: GET /v1/nodes: " +
                                                      r->body.substr(0, 300));
      names_[i] = d["self"].GetString();
      if (i == 0) domain_ = d["domain"].GetString();
      else if (domain_ != d["domain"].GetString())
        return make_error(Errc::invalid_argument, "the ports are nodes of different domains");
      size_t up = 0;
      for (const auto& m : d["nodes"].GetArray())
        if (m.IsObject() && m.HasMember("state") && m["state"].IsString() && std::string(m["state"].GetString()) == "up")
          ++up;
      if (up < nodes_.size())
        return make_error(Errc::unavailable, names_[i] + " sees " + std::to_string(up) + " nodes up, not " +
                                                 std::to_string(nodes_.size()));
    }
    for (size_t i = 0; i < names_.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (names_[i] == names_[j]) return make_error(Errc::invalid_argument, "two ports reach node " + names_[i]);
    return Status::Ok();
  }
  const std::string& name(size_t i) const { return names_[i]; }
  const std::string& leader() const { return names_[0]; }
  const std::string& domain() const { return domain_; }

  // What goes through which node, for the JSON line, e.g. "publish persons
  // via n1 direct, auctions via n2, bids via n3; subscribe via n3; deploy
  // via n2; query on n1".
  // Cut: "publish persons via n1 leader, auctions via n2 leader, bids via
  // n3 leader; subscribe via n1 output leader; deploy via n2; query cut".
  std::string forwarded(size_t subscribe_index) const {
    std::string out = "publish";
    for (int s = 0; s < kStreams; ++s) {
      out += std::string(s ? ", " : " ") + kStreamNames[s] + " via " + names_[publish_index(s)];
      if (cut_ && publish_index(s) == leader_index(s)) out += " leader";
      else if (publish_index(s) == 0) out += " direct";
    }
    out += "; subscribe via " + names_[subscribe_index] + (cut_ ? " output leader" : "") + "; deploy via " +
           names_[cluster() ? 1 : 0] + (cut_ ? "; query cut" : "; query on " + leader());
    return out;
  }

 private:
  std::vector<bench::Node> nodes_;
  std::vector<std::string> names_;
  std::string domain_;
  bool cut_;
};

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double loadavg_1m() {
  std::ifstream in("/proc/loadavg");
  double l = -1;
  in >> l;
  return l;
}

// CPU seconds (user + system, every thread) of process `pid` so far, from
// /proc/PID/stat; -1 when it cannot be read. On a loaded machine the wall
// clock says little, the CPU time per event says what the node costs.
double process_cpu_seconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return -1;
  const size_t close = line.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return -1;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  // Fields 3.. follow the name; utime and stime are fields 14 and 15.
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// The CPU seconds of every process of `pids` together; -1 when there are
// none or one cannot be read.
double nodes_cpu_seconds(const std::vector<int>& pids) {
  double sum = 0;
  for (int pid : pids) {
    const double s = process_cpu_seconds(pid);
    if (s < 0) return -1;
    sum += s;
  }
  return pids.empty() ? -1 : sum;
}

// This process's CPU seconds (every thread).
double self_cpu_seconds() { return process_cpu_seconds(static_cast<int>(::getpid())); }

std::string json_escape(std::string_view s) {
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  w.String(s.data(), static_cast<rapidjson::SizeType>(s.size()));
  return buf.GetString();
}

std::string schema_json(const engine::Schema& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ",";
    out += "{\"name\":\"" + s.field(i).name + "\",\"type\":\"" + std::string(engine::type_name(s.field(i).type)) + "\"}";
  }
  return out + "]";
}

// ------------------------------------------------------------- the events

// One stream's end marker: event time `t`, ids and numbers `id` (negative:
// no person, auction or seller has one; a different one per stream, so that
// the markers do not join each other), timestamps t, strings empty.
Batch end_marker(const engine::SchemaPtr& schema, engine::EventTime t, int64_t id) {
  engine::BatchBuilder bb(schema);
  for (size_t c = 0; c < schema->size(); ++c) {
    engine::Column& col = bb.column(c);
    switch (schema->field(c).type) {
      case engine::Type::Int64: col.ints.push_back(id); break;
      case engine::Type::Timestamp: col.ints.push_back(t); break;
      case engine::Type::Double: col.doubles.push_back(static_cast<double>(id)); break;
      case engine::Type::Bool: col.bools.push_back(0); break;
      case engine::Type::String: col.append_str(""); break;
    }
  }
  bb.event_time().push_back(t);
  bb.seq().push_back(0);
  return bb.finish();
}

// The events as the publishers send them: per chunk one binary message per
// stream (empty batches are not sent), then the end markers.
struct Feed {
  nexmark::Events events;
  Chunk markers;
  std::vector<std::string> messages[kStreams];  // encoded, in order, markers last
  uint64_t bytes[kStreams] = {0, 0, 0};
};

Result<Feed> make_feed(const Args& a) {
  nexmark::GeneratorConfig config;
  config.events = a.events;
  config.seed = a.seed;
  config.chunk_events = a.chunk;
  ENTENTE_RETURN_IF_ERROR(config.validate());
  Feed f;
  ENTENTE_ASSIGN_OR_RETURN(f.events, nexmark::generate(config));
  nexmark::Generator g(config);
  const engine::EventTime end = g.time_of(a.events) + 3'600'000;
  f.markers.persons = end_marker(nexmark::person_schema(), end, -1);
  f.markers.auctions = end_marker(nexmark::auction_schema(), end, -2);
  f.markers.bids = end_marker(nexmark::bid_schema(), end, -3);
  for (int s = 0; s < kStreams; ++s) {
    for (const Chunk& c : f.events.chunks) {
      const Batch& b = c.*kStreamOf[s];
      if (b.empty()) continue;
      std::string m;
      engine::encode_batch(b, m);
      f.bytes[s] += m.size();
      f.messages[s].push_back(std::move(m));
    }
    std::string m;
    engine::encode_batch(f.markers.*kStreamOf[s], m);
    f.messages[s].push_back(std::move(m));
  }
  return f;
}

// ------------------------------------------------------ engine-only run

// One fragment of a query cut across the nodes (--cut): its name, its
// boxes, and its node (an index into the ports).
struct Fragment {
  std::string name;
  std::vector<std::string> boxes;
  size_t node = 0;
};

struct Query {
  std::string name;  // "q5"
  std::string text;  // the query network as the API takes it
  engine::QueryNetwork net;
  std::vector<int> feeds;  // stream index per network input
  std::vector<Fragment> cut;  // with --cut
  size_t output_node = 0;     // with --cut: the node of the fragment that writes the output
  std::string movable;        // with --cut: the stateful fragment that reads no input stream
  std::string splittable;     // with --cut: the fragment holding the keyed (or joined) state, asked to split
  std::string keyed_box;      // with --cut: its stateful box (a split names its copies BOX-pI)
};

// The cut of q5 and q8 (see "Cut" above). A fragment that reads an input
// stream is on the node that leads it (stream s on node s, the server
// refuses anything else with 409); the others spread the work over the
// nodes the figure is about.
Status plan_cut(Query& q) {
  if (q.name == "q5") {
    q.cut = {{"counts", {"counts"}, kBids}, {"hot", {"hot"}, 0}};
    q.movable = "hot";
    q.splittable = "counts";
    q.keyed_box = "counts";
  } else if (q.name == "q8") {
    q.cut = {{"people", {"people"}, kPersons}, {"sellers", {"sellers"}, kAuctions}, {"new-users", {"new_users"}, 2 /* the third node */}};
    q.movable = "new-users";
    q.splittable = "new-users";
    q.keyed_box = "new_users";
  } else if (q.name == kQ5Count) {
    // One fragment: the split takes only a fragment that writes the
    // query's outputs, and the map after the aggregate may come along. A
    // placement on one node deploys the query whole, its one fragment
    // named `all` (docs/cluster.md, "Whole queries fail over too").
    // Not movable: a fragment that reads a query input runs next to it.
    q.cut = {{"all", {"counts", "hot"}, kBids}};
    q.splittable = "all";
    q.keyed_box = "counts";
  } else return make_error(Errc::invalid_argument, "--cut knows how to cut q5, q5count and q8, not " + q.name);
  // Every box of the network in one fragment, as the server checks too:
  // a box renamed in the query file should fail here, clearly.
  const std::vector<std::string> ids = q.net.box_ids();
  size_t placed = 0;
  for (const Fragment& f : q.cut) {
    for (const std::string& b : f.boxes) {
      if (std::find(ids.begin(), ids.end(), b) == ids.end())
        return make_error(Errc::invalid_argument, q.name + ".json has no box '" + b + "' for --cut to place");
      ++placed;
    }
  }
  if (placed != ids.size())
    return make_error(Errc::invalid_argument, q.name + ".json has boxes the --cut plan does not place");
  std::string from = q.net.outputs()[0].from;
  from = from.substr(0, from.find('.'));  // "box.port" → "box"
  for (const Fragment& f : q.cut)
    if (std::find(f.boxes.begin(), f.boxes.end(), from) != f.boxes.end()) q.output_node = f.node;
  return Status::Ok();
}

// q5.json without the `top` of its aggregate `counts` (see "Split" above).
Result<std::string> without_top(const std::string& q5) {
  rapidjson::Document d;
  d.Parse(q5.data(), q5.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("boxes") || !d["boxes"].IsArray())
    return make_error(Errc::invalid_argument, "q5.json: expected an object with boxes");
  bool dropped = false;
  for (auto& b : d["boxes"].GetArray())
    if (b.IsObject() && b.HasMember("id") && b["id"] == "counts" && b.HasMember("options") && b["options"].IsObject())
      dropped = b["options"].RemoveMember("top");
  if (!dropped) return make_error(Errc::invalid_argument, "q5.json: its box 'counts' has no top to leave out");
  d["name"].SetString(kQ5Count, d.GetAllocator());
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  d.Accept(w);
  return std::string(buf.GetString(), buf.GetSize());
}

Result<Query> load_query(const std::string& name) {
  nexmark::RunOptions ro;
  ENTENTE_ASSIGN_OR_RETURN(std::string text, nexmark::load_query_text(name == kQ5Count ? "q5" : name, ro.query_dir));
  if (name == kQ5Count) {
    ENTENTE_ASSIGN_OR_RETURN(text, without_top(text));
  }
  Diagnostics diag;
  auto net = engine::QueryNetwork::parse(text, diag);
  if (!net.ok()) return make_error(Errc::invalid_argument, name + ".json: " + diag.to_string());
  if (net->outputs().size() != 1) return make_error(Errc::invalid_argument, name + ".json must have one output");
  Query q{name, std::move(text), std::move(*net), {}, {}, 0, {}, {}, {}};
  for (const auto& in : q.net.inputs()) {
    int s = 0;
    while (s < kStreams && in.name != kStreamNames[s]) ++s;
    if (s == kStreams)
      return make_error(Errc::invalid_argument, name + ".json: input '" + in.name + "' is not persons, auctions or bids");
    q.feeds.push_back(s);
  }
  return q;
}

// The query over the events and the markers, on the calling thread, as
// runner.cpp pushes them (per chunk persons, auctions, bids), without
// finish(); the fastest of `repeat` runs, whose outputs must all agree.
struct EngineRun {
  double seconds = 0;
  std::vector<Batch> output;
};

Result<EngineRun> run_engine(const Query& q, const Feed& f, int repeat) {
  EngineRun run;
  std::vector<size_t> order(q.feeds.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return q.feeds[x] < q.feeds[y]; });
  for (int r = 0; r < repeat; ++r) {
    std::vector<Batch> out;
    auto exec = engine::Executor::create(q.net, [&out](size_t, const Batch& b) { out.push_back(b); });
    if (!exec.ok()) return exec.error();
    const auto t0 = Clock::now();
    auto push = [&](const Chunk& c) {
      for (size_t i : order) {
        const Batch& b = c.*kStreamOf[q.feeds[i]];
        if (!b.empty()) (*exec)->push(i, b);
      }
    };
    for (const Chunk& c : f.events.chunks) push(c);
    push(f.markers);
    const double secs = seconds_between(t0, Clock::now());
    if (r == 0) {
      run.seconds = secs;
      run.output = std::move(out);
    } else {
      run.seconds = std::min(run.seconds, secs);
      if (out != run.output) return make_error(Errc::conflict, "engine-only runs of " + q.name + " disagree");
    }
  }
  return run;
}

// ------------------------------------------------------- the comparison

bool cell_equal(const engine::Column& x, size_t i, const engine::Column& y, size_t j) {
  switch (x.type) {
    case engine::Type::Int64:
    case engine::Type::Timestamp: return x.ints[i] == y.ints[j];
    case engine::Type::Double: return std::memcmp(&x.doubles[i], &y.doubles[j], sizeof(double)) == 0;
    case engine::Type::Bool: return x.bools[i] == y.bools[j];
    case engine::Type::String: return x.str(i) == y.str(j);
  }
  return false;
}

// "" when `got` holds the rows of `want` in order (schema, values, event
// times; sequence numbers differ: the node numbers its stream from 1), else
// the first difference.
std::string compare_rows(const std::vector<Batch>& want, const std::vector<Batch>& got) {
  uint64_t nw = 0, ng = 0;
  for (const Batch& b : want) nw += b.rows();
  for (const Batch& b : got) ng += b.rows();
  if (nw != ng) return "engine-only " + std::to_string(nw) + " rows, end to end " + std::to_string(ng);
  size_t gb = 0, gr = 0;
  uint64_t row = 0;
  for (const Batch& w : want) {
    for (size_t wr = 0; wr < w.rows(); ++wr, ++gr, ++row) {
      while (gr >= got[gb].rows()) ++gb, gr = 0;
      const Batch& g = got[gb];
      if (!(*g.schema == *w.schema))
        return "schema: engine-only " + w.schema->to_string() + ", end to end " + g.schema->to_string();
      if (w.event_time[wr] != g.event_time[gr])
        return "row " + std::to_string(row) + ": event time " + std::to_string(w.event_time[wr]) + " against " +
               std::to_string(g.event_time[gr]);
      for (size_t c = 0; c < w.columns.size(); ++c)
        if (!cell_equal(w.column(c), wr, g.column(c), gr))
          return "row " + std::to_string(row) + ", field '" + w.schema->field(c).name + "' differs";
    }
  }
  return {};
}

// ------------------------------------------------------------ the broker

// Removes what an earlier run left (the query first: it pins its inputs).
void clean(const Endpoints& ep, const std::string& query_name) {
  (void)bench::call(ep.admin(), "DELETE", "/v1/queries/" + query_name);
  for (const char* s : kStreamNames) (void)bench::call(ep.admin(), "DELETE", std::string("/v1/streams/") + s);
}

Status expect(const Result<http::ClientResponse>& r, unsigned status, const std::string& what) {
  if (!r.ok()) return make_error(Errc::io_error, what + ": " + r.error().message);
  if (r->status != status)
    return make_error(Errc::invalid_argument, what + ": HTTP " + std::to_string(r->status) + " " + r->body);
  return Status::Ok();
}

// The streams, with the generator's schemas, event time date_time, and no
// retention bound on count or bytes (a run must not lose what the query has
// not read yet). In a domain of several nodes each is one copy
// ("replication": 1): the figure is of forwarding or of the cut, not of
// replicated logs (docs/cluster.md, "Replicated stream logs").
Status create_streams(const Endpoints& ep, const std::vector<bool>& publish) {
  const engine::SchemaPtr schemas[kStreams] = {nexmark::person_schema(), nexmark::auction_schema(),
                                               nexmark::bid_schema()};
  for (int s = 0; s < kStreams; ++s) {
    if (!publish[static_cast<size_t>(s)]) continue;
    const std::string body = std::string("{\"name\":\"") + kStreamNames[s] + "\",\"schema\":" +
                             schema_json(*schemas[s]) +
                             ",\"event_time\":\"date_time\",\"retention\":{\"max_tuples\":0,\"max_bytes\":0}" +
                             (ep.cluster() ? ",\"node\":\"" + ep.name(ep.leader_index(s)) + "\",\"replication\":1"
                                           : std::string()) +
                             "}";
    ENTENTE_RETURN_IF_ERROR(expect(bench::call(ep.admin(), "POST", "/v1/streams", body), 201,
                                   std::string("creating stream ") + kStreamNames[s]));
  }
  return Status::Ok();
}

// Polls `target` through `node` until it answers 200 and `check` (given the
// body) returns "", for up to 20 s: a node of a domain of several nodes
// learns the catalog from etcd's watch, a moment after the write.
Status await_ok(const bench::Node& node, const std::string& target,
                const std::function<std::string(const std::string&)>& check) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  std::string last;
  for (;;) {
    auto r = bench::call(node, "GET", target);
    if (!r.ok()) last = r.error().message;
    else if (r->status != 200) last = "HTTP " + std::to_string(r->status) + " " + r->body.substr(0, 300);
    else if ((last = check(r->body)).empty()) return Status::Ok();
    if (Clock::now() >= deadline) return make_error(Errc::unavailable, "GET " + target + " on port " +
                                                                        std::to_string(node.port) + ": " + last);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The fragments of a cut query as the JSON line and the deploy's
// "placement" name them: [{"name","node","boxes"}, ...].
std::string fragments_json(const Endpoints& ep, const Query& q) {
  std::string out = "[";
  for (size_t i = 0; i < q.cut.size(); ++i) {
    const Fragment& f = q.cut[i];
    out += std::string(i ? "," : "") + "{\"name\":" + json_escape(f.name) + ",\"node\":" + json_escape(ep.name(f.node)) +
           ",\"boxes\":[";
    for (size_t b = 0; b < f.boxes.size(); ++b) out += (b ? "," : "") + json_escape(f.boxes[b]);
    out += "]}";
  }
  return out + "]";
}

// "" when GET /v1/queries/{name} of a cut query (`body`) says "running"
// with each fragment of `q.cut` on the node asked, else what is not so.
std::string check_cut(const Endpoints& ep, const Query& q, const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.data(), body.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("state") || !d["state"].IsString() ||
      !d.HasMember("fragments") || !d["fragments"].IsArray())
    return "not a cut query: " + body.substr(0, 300);
  if (std::string(d["state"].GetString()) != "running") return std::string("state ") + d["state"].GetString();
  if (d["fragments"].Size() != q.cut.size())
    return std::to_string(d["fragments"].Size()) + " fragments, not " + std::to_string(q.cut.size());
  for (const Fragment& f : q.cut) {
    const rapidjson::Value* got = nullptr;
    for (const auto& g : d["fragments"].GetArray())
      if (g.IsObject() && g.HasMember("name") && g["name"].IsString() && f.name == g["name"].GetString()) got = &g;
    if (got == nullptr) return "no fragment " + f.name;
    if (!got->HasMember("node") || !(*got)["node"].IsString() || ep.name(f.node) != (*got)["node"].GetString())
      return "fragment " + f.name + " not on " + ep.name(f.node) + ": " + body.substr(0, 300);
  }
  return {};
}

// With several nodes, before anything is published: every node that will
// publish a stream knows it, every node says that every box of the query
// runs on the leader (placement "DOMAIN/LEADER"), or with --cut that the
// query runs with every fragment on its node, and the subscribing node
// knows the output stream.
Status await_cluster_ready(const Endpoints& ep, const std::vector<bool>& publish, const Query& q,
                           const std::string& query_name, const std::string& output, size_t subscribe_index) {
  if (!ep.cluster()) return Status::Ok();
  const auto any = [](const std::string&) { return std::string(); };
  for (int s = 0; s < kStreams; ++s)
    if (publish[static_cast<size_t>(s)])
      ENTENTE_RETURN_IF_ERROR(await_ok(ep.publish(s), std::string("/v1/streams/") + kStreamNames[s], any));
  const std::string want = ep.domain() + "/" + ep.leader();
  const auto on_leader = [&want](const std::string& body) -> std::string {
    rapidjson::Document d;
    d.Parse(body.data(), body.size());
    // In a domain of several nodes a whole query runs as a cut of one
    // fragment (docs/cluster.md, "Whole queries fail over too"): its
    // boxes are its runner's.
    const rapidjson::Value* q = d.IsObject() ? &d : nullptr;
    if (q && d.HasMember("fragments") && d["fragments"].IsArray() && d["fragments"].Size() == 1 &&
        d["fragments"][0].IsObject() && d["fragments"][0].HasMember("runner") &&
        d["fragments"][0]["runner"].IsObject())
      q = &d["fragments"][0]["runner"];
    if (d.HasParseError() || !q || !q->HasMember("boxes") || !(*q)["boxes"].IsArray() || (*q)["boxes"].Empty())
      return "no boxes in " + body.substr(0, 300);
    for (const auto& b : (*q)["boxes"].GetArray()) {
      if (!b.IsObject() || !b.HasMember("placement") || !b["placement"].IsString()) return "a box without placement";
      if (want != b["placement"].GetString())
        return std::string("box placed on ") + b["placement"].GetString() + ", not " + want;
    }
    return {};
  };
  const auto as_cut = [&ep, &q](const std::string& body) { return check_cut(ep, q, body); };
  for (size_t i = 0; i < ep.size(); ++i) {
    if (ep.cut()) ENTENTE_RETURN_IF_ERROR(await_ok(ep.node(i), "/v1/queries/" + query_name, as_cut));
    else ENTENTE_RETURN_IF_ERROR(await_ok(ep.node(i), "/v1/queries/" + query_name, on_leader));
  }
  return await_ok(ep.node(subscribe_index), "/v1/streams/" + output, any);
}

// The query document under the bench's names: query `query_name`, output
// stream `output`; with a `placement` ("" for none) as given.
Result<std::string> deployable(const Query& q, const std::string& query_name, const std::string& output,
                               const std::string& placement) {
  rapidjson::Document d;
  d.Parse(q.text.data(), q.text.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("outputs") || !d["outputs"].IsArray() ||
      d["outputs"].Size() != 1)
    return make_error(Errc::invalid_argument, q.name + ".json: expected an object with one output");
  d["name"].SetString(query_name.c_str(), static_cast<rapidjson::SizeType>(query_name.size()), d.GetAllocator());
  d["outputs"][0]["name"].SetString(output.c_str(), static_cast<rapidjson::SizeType>(output.size()),
                                    d.GetAllocator());
  if (!placement.empty()) {
    rapidjson::Document p(&d.GetAllocator());
    p.Parse(placement.data(), placement.size());
    if (p.HasParseError()) return make_error(Errc::invalid_argument, "bad placement " + placement);
    d.RemoveMember("placement");
    d.AddMember("placement", rapidjson::Value(p, d.GetAllocator()), d.GetAllocator());
  }
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  d.Accept(w);
  return std::string(buf.GetString(), buf.GetSize());
}

// Reads the output stream on its own thread until it holds `expected` rows,
// then a little longer to see that no more come. Resumes after a close
// (e.g. 4001, slow consumer) from the next sequence number.
class Subscriber final {
 public:
  Subscriber(const bench::Node& node, std::string stream, uint64_t expected)
      : node_(node), stream_(std::move(stream)), expected_(expected) {}
  ~Subscriber() { stop(); }
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  // Connects (so that nothing published afterwards is missed) and starts
  // reading.
  Status start() {
    auto ws = connect(0);
    if (!ws.ok()) return ws.error();
    thread_ = std::thread([this, w = std::move(*ws)]() mutable { loop(std::move(w)); });
    return Status::Ok();
  }
  // Waits until the expected rows are in, an error, or `deadline`.
  // (A condition variable, not polling: on two shared cores a polling
  // waiter would take CPU from the node it measures.)
  void wait(Clock::time_point deadline) {
    std::unique_lock lock(mu_);
    cv_.wait_until(lock, deadline, [this] { return complete_.load() || failed_.load(); });
  }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  bool complete() const { return complete_.load(); }
  Clock::time_point completed_at() const { return completed_at_; }  // REQUIRES: complete()
  uint64_t rows() const { return rows_.load(); }
  int resumed() const { return resumed_.load(); }
  // REQUIRES: stop() returned.
  const std::vector<Batch>& batches() const { return batches_; }
  const std::string& error() const { return error_; }

 private:
  Result<std::unique_ptr<http::WsClient>> connect(uint64_t from) {
    return http::WsClient::connect(bench::client_options(node_),
                                   "/v1/streams/" + stream_ + "/subscribe?format=binary&from=" + std::to_string(from),
                                   bench::auth(node_));
  }
  void fail(std::string why) {
    error_ = std::move(why);
    std::lock_guard lock(mu_);
    failed_ = true;
    cv_.notify_all();
  }
  void loop(std::unique_ptr<http::WsClient> ws) {
    uint64_t next = 0;  // the sequence number to resume from
    // After the last expected row: how long to keep listening for extra ones.
    Clock::time_point linger_until{};
    while (!stop_) {
      if (complete_ && Clock::now() >= linger_until) return;
      auto m = ws->receive(50);
      if (!m.ok() && m.error().code == Errc::unavailable) continue;
      if (!m.ok() || m->closed) {
        // A slow consumer is closed (4001) and resumes, and so does one
        // told that the stream is led by another node now (4010, a move:
        // through the same node, which relays to the new leader; it may
        // take the stream over a moment later); anything else ends.
        if (m.ok() && (m->close_code == 4001 || m->close_code == 4010)) {
          auto again = connect(next);
          for (int tries = 0; !again.ok() && tries < 100 && !stop_; ++tries) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            again = connect(next);
          }
          if (again.ok()) {
            ++resumed_;
            ws = std::move(*again);
            continue;
          }
        }
        return fail(m.ok() ? "closed " + std::to_string(m->close_code) + " " + m->close_reason
                           : m.error().message);
      }
      std::string_view in = m->data;
      auto b = engine::decode_batch(in);
      if (!b.ok()) return fail("decoding an output batch: " + b.error().message);
      if (!b->empty()) next = b->seq[b->rows() - 1] + 1;
      const uint64_t n = rows_ += b->rows();
      batches_.push_back(std::move(*b));
      if (n >= expected_ && !complete_) {
        completed_at_ = Clock::now();
        linger_until = completed_at_ + std::chrono::milliseconds(300);
        std::lock_guard lock(mu_);
        complete_ = true;
        cv_.notify_all();
      }
    }
  }

  bench::Node node_;
  std::string stream_;
  uint64_t expected_;
  std::thread thread_;
  std::mutex mu_;  // with cv_: wakes wait() on complete_ or failed_
  std::condition_variable cv_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> complete_{false};
  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> rows_{0};
  std::atomic<int> resumed_{0};
  Clock::time_point completed_at_{};  // written before complete_
  std::vector<Batch> batches_;        // read after stop()
  std::string error_;                 // written before failed_
};

// One publisher socket per stream, `window` messages in flight on each.
// A refused batch ends the run: sending it again after the ones behind it
// were stored would put its stream out of event-time order (the script
// configures the node so that back-pressure does not refuse: see
// scripts/bench-nexmark-e2e.sh).
class Publisher final {
 public:
  Publisher(const Endpoints& ep, const std::vector<bool>& publish, int window) : window_(window) {
    const std::string producer = "nexmark-e2e-" + std::to_string(::getpid()) + "-";
    for (int s = 0; s < kStreams; ++s) {
      if (!publish[static_cast<size_t>(s)]) continue;
      auto ws = http::WsClient::connect(bench::client_options(ep.publish(s)),
                                        std::string("/v1/streams/") + kStreamNames[s] + "/publish?producer_id=" +
                                            producer + kStreamNames[s] + "&producer_seq=1",
                                        bench::auth(ep.publish(s)));
      if (!ws.ok()) {
        error_ = std::string("publish ") + kStreamNames[s] + ": " + ws.error().message;
        return;
      }
      socks_[s] = std::move(*ws);
    }
  }
  const std::string& error() const { return error_; }

  // Sends every message of `feed`, chunk by chunk in stream order, and
  // waits for every answer; `before_chunk` (if any) is called with each
  // chunk's index before it is sent, and with the number of chunks once
  // all are.
  Status run(const Feed& feed, const std::function<void(size_t)>& before_chunk = {}) {
    ENTENTE_RETURN_IF_ERROR(send_chunks(feed, feed.events.chunks.size(), before_chunk));
    return finish(feed, before_chunk);
  }
  // Sends the chunks from the next one not sent up to `end` (exclusive),
  // `before_chunk` as for run().
  // With a `rate` (events per second, 0: as fast as the node answers),
  // chunk k of the call is not sent before k chunks' events at that rate
  // have passed since the call.
  Status send_chunks(const Feed& feed, size_t end, const std::function<void(size_t)>& before_chunk = {},
                     double rate = 0) {
    if (!error_.empty()) return make_error(Errc::io_error, error_);
    const auto t0 = Clock::now();
    uint64_t sent = 0;  // events of this call so far
    // Messages interleave as the generator produced them: a chunk's
    // persons, auctions, bids (empty batches were not encoded, so each
    // stream advances by its own count of messages per chunk).
    for (; next_chunk_ < end && next_chunk_ < feed.events.chunks.size(); ++next_chunk_) {
      if (before_chunk) before_chunk(next_chunk_);
      const Chunk& c = feed.events.chunks[next_chunk_];
      if (rate > 0)
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(static_cast<double>(sent) / rate)));
      sent += c.persons.rows() + c.auctions.rows() + c.bids.rows();
      for (int s = 0; s < kStreams; ++s)
        if (socks_[s] && !(c.*kStreamOf[s]).empty()) ENTENTE_RETURN_IF_ERROR(send(s, feed.messages[s][at_[s]++]));
    }
    return Status::Ok();
  }
  // Waits for the answers to everything sent.
  Status drain() {
    for (int s = 0; s < kStreams; ++s)
      while (socks_[s] && in_flight_[s] > 0) ENTENTE_RETURN_IF_ERROR(read_answer(s));
    return Status::Ok();
  }
  // After every chunk: the end markers, their answers, and the sockets
  // closed.
  Status finish(const Feed& feed, const std::function<void(size_t)>& before_chunk = {}) {
    if (!error_.empty()) return make_error(Errc::io_error, error_);
    if (before_chunk) before_chunk(next_chunk_);
    for (int s = 0; s < kStreams; ++s)
      if (socks_[s]) ENTENTE_RETURN_IF_ERROR(send(s, feed.messages[s][at_[s]++]));  // the end marker
    ENTENTE_RETURN_IF_ERROR(drain());
    for (int s = 0; s < kStreams; ++s)
      if (socks_[s]) (void)socks_[s]->close();
    return Status::Ok();
  }

 private:
  Status send(int s, const std::string& message) {
    if (in_flight_[s] >= window_) ENTENTE_RETURN_IF_ERROR(read_answer(s));
    ENTENTE_RETURN_IF_ERROR(socks_[s]->send(message, /*binary=*/true));
    ++in_flight_[s];
    return Status::Ok();
  }
  Status read_answer(int s) {
    auto m = socks_[s]->receive(60000);
    if (!m.ok()) return make_error(Errc::io_error, std::string("publish ") + kStreamNames[s] + ": " + m.error().message);
    if (m->closed)
      return make_error(Errc::io_error, std::string("publish ") + kStreamNames[s] + ": closed " +
                                            std::to_string(m->close_code) + " " + m->close_reason);
    rapidjson::Document d;
    d.Parse(m->data.data(), m->data.size());
    if (d.HasParseError() || !d.IsObject() || !d.HasMember("ack"))
      return make_error(Errc::unavailable, std::string("publish ") + kStreamNames[s] + " refused a batch: " + m->data);
    --in_flight_[s];
    return Status::Ok();
  }

  int window_;
  std::unique_ptr<http::WsClient> socks_[kStreams];
  int in_flight_[kStreams] = {0, 0, 0};
  size_t next_chunk_ = 0;               // the next chunk to send
  size_t at_[kStreams] = {0, 0, 0};     // per stream, its next message
  std::string error_;
};

// `body` as a JSON value: itself when it parses as an object, else as a
// string.
std::string as_json(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.data(), body.size());
  return !d.HasParseError() && d.IsObject() ? body : json_escape(body);
}

// --split: splits the query's keyed fragment once a third of the chunks are
// published and merges it back once two thirds are, on a thread of its own
// while the publishers go on (see "Split" above). The publisher's thread
// calls at_chunk(), and waits there at two thirds until the split has
// answered and before the end markers until the merge has: a split may
// take longer than the publishers (hundreds of thousands of events a
// second), and the merge must come while events still flow, the end
// marker after it. join() once the publishers are done.
class Splitter final {
 public:
  Splitter(const Endpoints& ep, const Query& q, std::string query_name, size_t chunks)
      : ep_(ep), q_(q), query_name_(std::move(query_name)), chunks_(chunks) {}
  ~Splitter() { (void)join(); }
  Splitter(const Splitter&) = delete;
  Splitter& operator=(const Splitter&) = delete;

  // Before chunk `chunk` is sent (`chunks` once all are, before the end
  // markers).
  void at_chunk(size_t chunk) {
    std::unique_lock lock(mu_);
    published_ = chunk;
    cv_.notify_all();
    if (chunk == chunks_ / 3 && !thread_.joinable()) thread_ = std::thread([this] { run(); });
    if (!thread_.joinable()) return;
    const auto t0 = Clock::now();
    if (chunk == 2 * chunks_ / 3) cv_.wait(lock, [this] { return split_answered_ || done_; });
    if (chunk == chunks_) cv_.wait(lock, [this] { return done_; });
    waited_s_ += seconds_between(t0, Clock::now());
  }
  // Waits for the split and the merge (at once, if the publishers stopped
  // early); an error when either answered something else than 200 or a
  // refusal of the split (409), or did not answer.
  Status join() {
    {
      std::lock_guard lock(mu_);
      published_ = chunks_;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
    return status_;
  }
  // The members the JSON line adds ("" when nothing was asked).
  // REQUIRES: join() returned.
  std::string json() const {
    if (split_.empty()) return {};
    char waited[64];
    std::snprintf(waited, sizeof waited, ",\"publisher_waited_ms\":%.0f", waited_s_ * 1e3);
    std::string out = ",\"chunks\":" + std::to_string(chunks_) + waited + ",\"split_at_chunk\":" +
                      std::to_string(split_at_);
    if (refused_) return out + ",\"split\":{\"refused\":" + std::to_string(refused_) + ",\"problem\":" + as_json(split_) +
                         "},\"merge\":null";
    return out + ",\"split\":" + as_json(split_) + ",\"split_parts\":" + parts_ + ",\"merge_at_chunk\":" +
           std::to_string(merge_at_) + ",\"merge\":" + (merge_.empty() ? "null" : as_json(merge_));
  }

 private:
  void run() {
    split();
    std::lock_guard lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void split() {
    size_t from = 0;
    for (const Fragment& fr : q_.cut)
      if (fr.name == q_.splittable) from = fr.node;
    // The parts on the two nodes the fragment is not on; the router and
    // the merge stay on its node.
    std::string body = "{\"parts\":[";
    for (size_t i = 1; i < ep_.size(); ++i)
      body += std::string(i > 1 ? "," : "") + "{\"node\":" + json_escape(ep_.name((from + i) % ep_.size())) + "}";
    body += "]}";
    const std::string target = "/v1/queries/" + query_name_ + "/fragments/" + q_.splittable;
    split_at_ = published();
    auto r = bench::call(ep_.deploy(), "POST", target + "/split", body);
    if (!r.ok()) {
      status_ = make_error(Errc::io_error, "splitting " + q_.splittable + ": " + r.error().message);
      return;
    }
    split_ = r->body;
    if (r->status == 409) {
      refused_ = 409;
      return;
    }
    if (r->status != 200) {
      status_ = make_error(Errc::unavailable, "splitting " + q_.splittable + ": " + std::to_string(r->status) + " " + r->body);
      return;
    }
    {
      std::unique_lock lock(mu_);
      split_answered_ = true;
      cv_.notify_all();
      cv_.wait(lock, [this] { return published_ >= 2 * chunks_ / 3; });
    }
    // Every part has rows routed to it by now, but on a loaded machine one
    // may not have read any yet (its read of the router's stream still
    // starting): wait up to 10 s until each has, so that the line shows
    // whether both worked rather than how far one got.
    for (int i = 0; i < 200; ++i) {
      parts_ = parts_json();
      if (parts_ != "null" && parts_.find("\"tuples_in\":0,") == std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    merge_at_ = published();
    r = bench::call(ep_.deploy(), "POST", target + "/merge", "");
    if (!r.ok()) status_ = make_error(Errc::io_error, "merging " + q_.splittable + ": " + r.error().message);
    else if (r->status != 200)
      status_ = make_error(Errc::unavailable, "merging " + q_.splittable + ": " + std::to_string(r->status) + " " + r->body);
    merge_ = r.ok() ? r->body : std::string();
  }
  size_t published() {
    std::lock_guard lock(mu_);
    return published_;
  }

  // Per part of the split (its answer's "parts"), its node and what its
  // copy of the keyed box has read so far and its runner's CPU seconds,
  // from GET /v1/queries/{name}: [{"fragment","node","tuples_in","cpu_seconds"}]
  // (null figures when the node does not say).
  std::string parts_json() const {
    rapidjson::Document split, got;
    split.Parse(split_.data(), split_.size());
    if (split.HasParseError() || !split.IsObject() || !split.HasMember("parts") || !split["parts"].IsArray() ||
        !split.HasMember("keyed_box") || !split["keyed_box"].IsString())
      return "null";
    auto r = bench::call(ep_.deploy(), "GET", "/v1/queries/" + query_name_);
    if (r.ok() && r->status == 200) got.Parse(r->body.data(), r->body.size());
    const bool fragments = r.ok() && r->status == 200 && !got.HasParseError() && got.IsObject() &&
                           got.HasMember("fragments") && got["fragments"].IsArray();
    const std::string copy = std::string(split["keyed_box"].GetString()) + "-p";
    std::string out = "[";
    for (const auto& p : split["parts"].GetArray()) {
      if (!p.IsObject() || !p.HasMember("fragment") || !p["fragment"].IsString()) continue;
      const std::string name = p["fragment"].GetString();
      std::string tuples = "null", cpu = "null", node = "null";
      if (p.HasMember("node") && p["node"].IsString()) node = json_escape(p["node"].GetString());
      for (rapidjson::SizeType i = 0; fragments && i < got["fragments"].Size(); ++i) {
        const rapidjson::Value& fr = got["fragments"][i];
        if (!fr.IsObject() || !fr.HasMember("name") || fr["name"] != name.c_str() || !fr.HasMember("runner") ||
            !fr["runner"].IsObject())
          continue;
        const auto& runner = fr["runner"];
        if (runner.HasMember("boxes") && runner["boxes"].IsArray())
          for (const auto& b : runner["boxes"].GetArray())
            if (b.IsObject() && b.HasMember("id") && b["id"].IsString() &&
                std::string_view(b["id"].GetString()).starts_with(copy) && b.HasMember("tuples_in") &&
                b["tuples_in"].IsUint64())
              tuples = std::to_string(b["tuples_in"].GetUint64());
        if (runner.HasMember("load") && runner["load"].IsObject() && runner["load"].HasMember("cpu_seconds") &&
            runner["load"]["cpu_seconds"].IsNumber()) {
          char v[32];
          std::snprintf(v, sizeof v, "%.3f", runner["load"]["cpu_seconds"].GetDouble());
          cpu = v;
        }
      }
      out += std::string(out.size() > 1 ? "," : "") + "{\"fragment\":" + json_escape(name) + ",\"node\":" + node +
             ",\"tuples_in\":" + tuples + ",\"cpu_seconds\":" + cpu + "}";
    }
    return out + "]";
  }

  const Endpoints& ep_;
  const Query& q_;
  std::string query_name_;
  size_t chunks_;
  std::thread thread_;
  std::mutex mu_;  // guards the three below; with cv_, the publisher and thread_ wait for each other
  std::condition_variable cv_;
  size_t published_ = 0;         // the chunk the publisher is at
  bool split_answered_ = false;  // the split answered 200
  bool done_ = false;            // thread_ has nothing more to ask
  double waited_s_ = 0;          // the publisher's wait in at_chunk() (its thread only)
  // Written by thread_, read after join().
  Status status_ = Status::Ok();
  size_t split_at_ = 0, merge_at_ = 0;
  int refused_ = 0;  // the split's status when it refused
  std::string split_, merge_, parts_ = "null";
};

struct E2eRun {
  double seconds = 0;          // first publish .. last expected output row received
  double publish_seconds = 0;  // first publish .. last publish answer
  uint64_t rows = 0;
  std::string mismatch;  // "" when the rows equal the engine-only rows
  double node_cpu_s = -1;  // the nodes' CPU time over `seconds` (--node-pid, summed)
  std::vector<double> each_node_cpu_s;  // per --node-pid, in their order
  double bench_cpu_s = 0;  // this process's (publisher, subscriber) over `seconds`
  size_t subscribe_index = 0;  // the node the output was read through
  std::string move;  // --move: the move's answer (JSON)
  std::string split;  // --split: the split's and the merge's answers, as members of the JSON line
  int resumed = 0;   // times the subscriber resumed (4001, 4010)
};

Result<E2eRun> run_e2e(const Args& a, const Endpoints& ep, const Query& q, const Feed& f, const EngineRun& engine) {
  const std::string query_name = "nexmark-e2e-" + q.name;
  const std::string output = "nexmark-e2e-" + q.name + "-out";
  std::vector<bool> publish(kStreams, !a.inputs_only);
  for (int s : q.feeds) publish[static_cast<size_t>(s)] = true;
  uint64_t expected = 0;
  for (const Batch& b : engine.output) expected += b.rows();
  // No rows would make the comparison say nothing and the end unknowable.
  if (expected == 0)
    return make_error(Errc::invalid_argument, q.name + ": the engine alone produced no rows over " +
                                                  std::to_string(f.events.total()) + " events; give more --events");

  clean(ep, query_name);
  ENTENTE_RETURN_IF_ERROR(create_streams(ep, publish));
  const std::string placement = ep.cut() ? "{\"fragments\":" + fragments_json(ep, q) + "}" : std::string();
  ENTENTE_ASSIGN_OR_RETURN(std::string doc, deployable(q, query_name, output, placement));
  ENTENTE_RETURN_IF_ERROR(expect(bench::call(ep.deploy(), "POST", "/v1/queries", doc), 201, "deploying " + q.name));
  E2eRun run;
  run.subscribe_index = ep.cut() ? q.output_node : ep.size() - 1;
  ENTENTE_RETURN_IF_ERROR(await_cluster_ready(ep, publish, q, query_name, output, run.subscribe_index));

  Subscriber sub(ep.node(run.subscribe_index), output, expected);
  ENTENTE_RETURN_IF_ERROR(sub.start());
  Publisher pub(ep, publish, a.window);
  const double node_cpu0 = nodes_cpu_seconds(a.node_pids);
  std::vector<double> each_cpu0;
  for (int pid : a.node_pids) each_cpu0.push_back(process_cpu_seconds(pid));
  const double bench_cpu0 = self_cpu_seconds();
  const auto t0 = Clock::now();
  // --move: the fragment moves on its own thread, the publishers going on.
  std::thread mover;
  Status moved = Status::Ok();
  const size_t chunks = f.events.chunks.size();
  auto halfway = [&](size_t chunk) {
    if (chunk != chunks / 2) return;
    mover = std::thread([&] {
      size_t from = 0;
      for (const Fragment& fr : q.cut)
        if (fr.name == q.movable) from = fr.node;
      const std::string to = ep.name((from + 1) % ep.size());
      auto r = bench::call(ep.deploy(), "POST", "/v1/queries/" + query_name + "/fragments/" + q.movable + "/move",
                           "{\"node\":\"" + to + "\"}");
      if (!r.ok()) moved = make_error(Errc::io_error, "moving " + q.movable + ": " + r.error().message);
      else if (r->status != 200)
        moved = make_error(Errc::unavailable, "moving " + q.movable + ": " + std::to_string(r->status) + " " + r->body);
      else run.move = r->body;
    });
  };
  // --split: the split and the merge on their own thread too.
  Splitter splitter(ep, q, query_name, chunks);
  std::function<void(size_t)> before_chunk;
  if (a.move && ep.cut()) before_chunk = halfway;
  if (a.split && ep.cut()) before_chunk = [&splitter](size_t chunk) { splitter.at_chunk(chunk); };
  Status s = pub.run(f, before_chunk);
  run.publish_seconds = seconds_between(t0, Clock::now());
  if (mover.joinable()) mover.join();
  Status split = splitter.join();
  if (!s.ok()) return s.error();
  if (!moved.ok()) return moved.error();
  if (!split.ok()) return split.error();
  run.split = splitter.json();
  sub.wait(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.timeout_s)));
  if (node_cpu0 >= 0) {
    run.node_cpu_s = nodes_cpu_seconds(a.node_pids) - node_cpu0;
    for (size_t i = 0; i < a.node_pids.size(); ++i)
      run.each_node_cpu_s.push_back(process_cpu_seconds(a.node_pids[i]) - each_cpu0[i]);
  }
  run.bench_cpu_s = self_cpu_seconds() - bench_cpu0;
  sub.stop();
  run.rows = sub.rows();
  run.resumed = sub.resumed();
  if (!sub.error().empty()) run.mismatch = "subscriber: " + sub.error();
  else if (!sub.complete())
    run.mismatch = "only " + std::to_string(sub.rows()) + " of " + std::to_string(expected) + " output rows within " +
                   std::to_string(a.timeout_s) + " s";
  else
    run.mismatch = compare_rows(engine.output, sub.batches());
  run.seconds = seconds_between(t0, sub.complete() ? sub.completed_at() : Clock::now());
  clean(ep, query_name);  // frees the disk for the next query
  return run;
}

// ------------------------------------------------- --split-throughput

// What the query's keyed box has read so far, summed over its copies once
// split (box KEYED or KEYED-pI in any fragment), from GET
// /v1/queries/{name} through `node`.
Result<uint64_t> keyed_tuples_in(const bench::Node& node, const std::string& query_name, const std::string& keyed) {
  auto r = bench::call(node, "GET", "/v1/queries/" + query_name);
  if (!r.ok()) return make_error(Errc::io_error, "GET /v1/queries/" + query_name + ": " + r.error().message);
  rapidjson::Document d;
  d.Parse(r->body.data(), r->body.size());
  if (r->status != 200 || d.HasParseError() || !d.IsObject() || !d.HasMember("fragments") || !d["fragments"].IsArray())
    return make_error(Errc::unavailable, "GET /v1/queries/" + query_name + ": " + r->body.substr(0, 300));
  const std::string copy = keyed + "-p";
  uint64_t sum = 0;
  for (const auto& fr : d["fragments"].GetArray()) {
    if (!fr.IsObject() || !fr.HasMember("runner") || !fr["runner"].IsObject()) continue;
    const auto& runner = fr["runner"];
    if (!runner.HasMember("boxes") || !runner["boxes"].IsArray()) continue;
    for (const auto& b : runner["boxes"].GetArray()) {
      if (!b.IsObject() || !b.HasMember("id") || !b["id"].IsString() || !b.HasMember("tuples_in") ||
          !b["tuples_in"].IsUint64())
        continue;
      const std::string_view id = b["id"].GetString();
      if (id == keyed || id.starts_with(copy)) sum += b["tuples_in"].GetUint64();
    }
  }
  return sum;
}

// One phase of --split-throughput: the figures of its JSON line.
struct Phase {
  uint64_t bids = 0;              // bids published in the phase
  double publish_seconds = 0;     // its first publish .. its last answer
  double seconds = 0;             // its first publish .. the keyed box has read them all
  std::vector<double> nodes_cpu;  // per --node-pid, over `seconds`
};

constexpr int kPollMs = 100;  // how often a phase asks how far the keyed box has read

// Publishes chunks up to `end` as fast as the publisher goes and waits
// until the keyed box (or its copies) has read `base` + the phase's bids.
Result<Phase> run_phase(const Args& a, const Endpoints& ep, const Query& q, const std::string& query_name,
                        const Feed& f, Publisher& pub, size_t begin, size_t end, uint64_t base) {
  Phase p;
  for (size_t c = begin; c < end; ++c) p.bids += f.events.chunks[c].bids.rows();
  std::vector<double> cpu0;
  for (int pid : a.node_pids) cpu0.push_back(process_cpu_seconds(pid));
  const auto t0 = Clock::now();
  ENTENTE_RETURN_IF_ERROR(pub.send_chunks(f, end, {}, a.offered_rate));
  ENTENTE_RETURN_IF_ERROR(pub.drain());
  p.publish_seconds = seconds_between(t0, Clock::now());
  const bench::Node& node = ep.node(q.output_node);
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.timeout_s));
  for (;;) {
    // (A runner's box counters are read between its runs: a reading may be
    // a run late, never early.)
    ENTENTE_ASSIGN_OR_RETURN(uint64_t read, keyed_tuples_in(node, query_name, q.keyed_box));
    if (read >= base + p.bids) break;
    if (Clock::now() >= deadline)
      return make_error(Errc::unavailable, q.name + ": the keyed box read " + std::to_string(read - base) + " of " +
                                               std::to_string(p.bids) + " bids within " + std::to_string(a.timeout_s) +
                                               " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));
  }
  p.seconds = seconds_between(t0, Clock::now());
  for (size_t i = 0; i < a.node_pids.size(); ++i) p.nodes_cpu.push_back(process_cpu_seconds(a.node_pids[i]) - cpu0[i]);
  return p;
}

// --split-throughput (see "Split throughput" above): the first half of the
// chunks with the keyed fragment unsplit, then the split into two parts on
// the other two nodes, then the second half; one JSON line per phase.
// The rows must still equal the engine-only rows.
Status run_split_throughput(const Args& a, const Endpoints& ep, const Query& q, const Feed& f,
                            const EngineRun& engine) {
  const std::string query_name = "nexmark-e2e-" + q.name;
  const std::string output = "nexmark-e2e-" + q.name + "-out";
  std::vector<bool> publish(kStreams, !a.inputs_only);
  for (int s : q.feeds) publish[static_cast<size_t>(s)] = true;
  uint64_t expected = 0;
  for (const Batch& b : engine.output) expected += b.rows();
  const double load = loadavg_1m();
  clean(ep, query_name);
  ENTENTE_RETURN_IF_ERROR(create_streams(ep, publish));
  ENTENTE_ASSIGN_OR_RETURN(std::string doc, deployable(q, query_name, output, "{\"fragments\":" + fragments_json(ep, q) + "}"));
  ENTENTE_RETURN_IF_ERROR(expect(bench::call(ep.deploy(), "POST", "/v1/queries", doc), 201, "deploying " + q.name));
  ENTENTE_RETURN_IF_ERROR(await_cluster_ready(ep, publish, q, query_name, output, q.output_node));
  Subscriber sub(ep.node(q.output_node), output, expected);
  ENTENTE_RETURN_IF_ERROR(sub.start());
  Publisher pub(ep, publish, a.window);
  const size_t half = f.events.chunks.size() / 2;

  ENTENTE_ASSIGN_OR_RETURN(Phase one, run_phase(a, ep, q, query_name, f, pub, 0, half, 0));
  size_t from = 0;
  for (const Fragment& fr : q.cut)
    if (fr.name == q.splittable) from = fr.node;
  std::string parts_body = "{\"parts\":[";
  for (size_t i = 1; i < ep.size(); ++i)
    parts_body += std::string(i > 1 ? "," : "") + "{\"node\":" + json_escape(ep.name((from + i) % ep.size())) + "}";
  parts_body += "]}";
  auto split = bench::call(ep.deploy(), "POST", "/v1/queries/" + query_name + "/fragments/" + q.splittable + "/split",
                           parts_body);
  ENTENTE_RETURN_IF_ERROR(expect(split, 200, "splitting " + q.splittable));
  // The parts start counting from their seed; whatever they hold already
  // is the base of the second phase.
  ENTENTE_ASSIGN_OR_RETURN(uint64_t base, keyed_tuples_in(ep.node(q.output_node), query_name, q.keyed_box));
  ENTENTE_ASSIGN_OR_RETURN(Phase two, run_phase(a, ep, q, query_name, f, pub, half, f.events.chunks.size(), base));
  ENTENTE_RETURN_IF_ERROR(pub.finish(f));
  sub.wait(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.timeout_s)));
  sub.stop();
  std::string mismatch;
  if (!sub.error().empty()) mismatch = "subscriber: " + sub.error();
  else if (!sub.complete()) mismatch = "only " + std::to_string(sub.rows()) + " of " + std::to_string(expected) + " output rows";
  else mismatch = compare_rows(engine.output, sub.batches());
  clean(ep, query_name);

  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  char rate[32] = "null";  // the pace asked of the publisher, all three streams' events
  if (a.offered_rate > 0) std::snprintf(rate, sizeof rate, "%.0f", a.offered_rate);
  for (int parts : {1, 2}) {
    const Phase& p = parts == 1 ? one : two;
    std::string cpu = "[";
    for (size_t i = 0; i < p.nodes_cpu.size(); ++i) {
      char v[32];
      std::snprintf(v, sizeof v, "%s%.3f", i ? "," : "", p.nodes_cpu[i]);
      cpu += v;
    }
    cpu += "]";
    std::string nodes = "[" + json_escape(ep.name(from)) + "]";
    if (parts == 2) nodes = "[" + json_escape(ep.name((from + 1) % ep.size())) + "," + json_escape(ep.name((from + 2) % ep.size())) + "]";
    std::printf(
        "{\"bench\":\"split_throughput\",\"query\":\"%s\",\"fragment\":\"%s\",\"parts\":%d,\"parts_nodes\":%s,"
        "\"bids\":%llu,\"publish_seconds\":%.3f,\"offered_tuples_per_s\":%.0f,\"seconds\":%.3f,\"tuples_per_s\":%.0f,"
        "\"catch_up_s\":%.3f,\"offered_events_per_s\":%s,\"poll_ms\":%d,\"nodes_cpu_s\":%s,\"cpu_us_per_tuple\":%.3f,"
        "\"results_match\":%s,\"cores\":%d,\"loadavg_1m\":%.2f%s%s}\n",
        q.name.c_str(), q.splittable.c_str(), parts, nodes.c_str(), static_cast<unsigned long long>(p.bids),
        p.publish_seconds, static_cast<double>(p.bids) / p.publish_seconds, p.seconds,
        static_cast<double>(p.bids) / p.seconds, p.seconds - p.publish_seconds, rate, kPollMs, cpu.c_str(),
        [&] {
          double sum = 0;
          for (double c : p.nodes_cpu) sum += c;
          return sum * 1e6 / static_cast<double>(p.bids);
        }(),
        mismatch.empty() ? "true" : "false", cores, load, parts == 2 ? ",\"split\":" : "",
        parts == 2 ? as_json(split->body).c_str() : "");
  }
  std::fflush(stdout);
  if (!mismatch.empty()) return make_error(Errc::conflict, q.name + ": the rows differ: " + mismatch);
  return Status::Ok();
}

int usage() {
  std::fprintf(stderr,
               "usage: nexmark_e2e --port P [--port P2 ...] [--host H] [--token T] [--tls --ca FILE] [--events N] "
               "[--queries q5,q8] [--chunk N] [--seed S] [--window N] [--repeat N] [--timeout S] [--inputs-only] "
               "[--node-pid PID ...] [--cut [--move|--split|--split-throughput [--offered-rate EVENTS_PER_S]]]\n");
  return 2;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Reads the command line into `a`; 0, or the exit status (2) on bad
// arguments, with a message on stderr.
int parse_args(int argc, char** argv, Args& a) {
  std::vector<uint16_t> ports;
  bench::ArgReader r(kProg, argc, argv);
  while (r.next()) {
    const std::string& n = r.name();
    if (n == "--host") a.proto.host = r.value();
    else if (n == "--port") ports.push_back(r.port());
    else if (n == "--token") a.proto.token = r.value();
    else if (n == "--tls") a.proto.tls = true;
    else if (n == "--ca") a.proto.ca_file = r.value();
    else if (n == "--events") a.events = static_cast<uint64_t>(std::atoll(r.value().c_str()));
    else if (n == "--queries") a.queries = split(r.value());
    else if (n == "--chunk") a.chunk = static_cast<uint32_t>(r.integer());
    else if (n == "--seed") a.seed = static_cast<uint64_t>(std::atoll(r.value().c_str()));
    else if (n == "--window") a.window = r.integer();
    else if (n == "--repeat") a.repeat = r.integer();
    else if (n == "--timeout") a.timeout_s = r.number();
    else if (n == "--inputs-only") a.inputs_only = true;
    else if (n == "--node-pid") a.node_pids.push_back(r.integer());
    else if (n == "--cut") a.cut = true;
    else if (n == "--move") a.move = true;
    else if (n == "--split") a.split = true;
    else if (n == "--split-throughput") a.split_throughput = true;
    else if (n == "--offered-rate") a.offered_rate = r.number();
    else return usage();
  }
  if (ports.empty() || a.events == 0 || a.window < 1 || a.window > 64 || a.repeat < 1 || a.repeat > 100 ||
      !(a.timeout_s > 0) || a.queries.empty()) {
    std::fprintf(stderr, "%s: --port is required; --events, --timeout > 0; --window 1..64; --repeat 1..100\n", kProg);
    return usage();
  }
  if ((a.move || a.split || a.split_throughput) && !a.cut) {
    std::fprintf(stderr, "%s: --move, --split and --split-throughput need --cut\n", kProg);
    return 2;
  }
  if (a.offered_rate < 0 || (a.offered_rate > 0 && !a.split_throughput)) {
    std::fprintf(stderr, "%s: --offered-rate (events per second, > 0) goes with --split-throughput\n", kProg);
    return 2;
  }
  if (int(a.move) + int(a.split) + int(a.split_throughput) > 1) {
    std::fprintf(stderr, "%s: one of --move, --split, --split-throughput\n", kProg);
    return 2;
  }
  if (a.cut && ports.size() != kStreams) {
    std::fprintf(stderr, "%s: --cut takes the three ports of a domain's three nodes\n", kProg);
    return 2;
  }
  if (ports.size() > 8) {
    std::fprintf(stderr, "%s: at most 8 --port\n", kProg);
    return 2;
  }
  for (uint16_t p : ports) {
    bench::Node n = a.proto;
    n.port = p;
    a.nodes.push_back(n);
  }
  return 0;
}

// The query's JSON line; a figure that does not exist is null (the
// end-to-end rate of a run whose output differs or did not all arrive, the
// node's CPU without --node-pid).
void print_line(const Args& a, const Endpoints& ep, const std::string& mode, const Query& q, const Feed& f,
                const EngineRun& engine, const E2eRun& e2e, double load) {
  uint64_t outputs = 0;
  for (const Batch& b : engine.output) outputs += b.rows();
  const double n = static_cast<double>(f.events.total());
  const double e2e_rate = n / e2e.seconds, engine_rate = n / engine.seconds;
  const bool match = e2e.mismatch.empty();
  char rate[32] = "null", ratio[32] = "null", cpu[32] = "null", cpu_per_event[32] = "null";
  if (match) {
    std::snprintf(rate, sizeof rate, "%.0f", e2e_rate);
    std::snprintf(ratio, sizeof ratio, "%.3f", e2e_rate / engine_rate);
  }
  if (e2e.node_cpu_s >= 0) {
    std::snprintf(cpu, sizeof cpu, "%.3f", e2e.node_cpu_s);
    std::snprintf(cpu_per_event, sizeof cpu_per_event, "%.3f", e2e.node_cpu_s * 1e6 / n);
  }
  // With several nodes, each one's CPU seconds: "nodes_cpu_s":[n1,n2,n3].
  std::string each;
  if (ep.cluster() && !e2e.each_node_cpu_s.empty()) {
    each = ",\"nodes_cpu_s\":[";
    for (size_t i = 0; i < e2e.each_node_cpu_s.size(); ++i) {
      char v[32];
      std::snprintf(v, sizeof v, "%s%.3f", i ? "," : "", e2e.each_node_cpu_s[i]);
      each += v;
    }
    each += "]";
  }
  // The bytes of the streams published (all three, or the query's inputs).
  uint64_t published = 0;
  for (int s = 0; s < kStreams; ++s)
    if (!a.inputs_only || std::find(q.feeds.begin(), q.feeds.end(), s) != q.feeds.end()) published += f.bytes[s];
  std::printf(
      "{\"bench\":\"nexmark_e2e\",\"query\":\"%s\",\"nodes\":%zu,\"cut\":%s,\"ingest_durability\":\"%s\",\"events\":%llu,"
      "\"published\":\"%s\",\"event_bytes\":%llu,\"chunk_events\":%u,\"seconds\":%.3f,\"publish_seconds\":%.3f,"
      "\"e2e_events_per_s\":%s,\"engine_events_per_s\":%.0f,\"ratio\":%s,\"target_events_per_s\":%s,"
      "\"node_cpu_s\":%s,\"node_cpu_us_per_event\":%s,\"bench_cpu_s\":%.3f,"
      "\"results_match\":%s,\"outputs\":%llu,\"outputs_received\":%llu,\"loadavg_1m\":%.2f%s%s%s%s%s%s%s%s%s}\n",
      q.name.c_str(), ep.size(), ep.cut() ? "true" : "false", mode.c_str(), static_cast<unsigned long long>(f.events.total()),
      a.inputs_only ? "inputs" : "all", static_cast<unsigned long long>(published), a.chunk, e2e.seconds,
      e2e.publish_seconds, rate, engine_rate, ratio, q.name == "q5" ? "1000000" : "null", cpu, cpu_per_event,
      e2e.bench_cpu_s, match ? "true" : "false", static_cast<unsigned long long>(outputs),
      static_cast<unsigned long long>(e2e.rows), load, each.c_str(), ep.cluster() ? ",\"forwarded\":" : "",
      ep.cluster() ? json_escape(ep.forwarded(e2e.subscribe_index)).c_str() : "", ep.cut() ? ",\"fragments\":" : "",
      ep.cut() ? fragments_json(ep, q).c_str() : "",
      e2e.move.empty() && e2e.split.empty() ? "" : (",\"subscriber_resumed\":" + std::to_string(e2e.resumed)).c_str(),
      e2e.move.empty() ? e2e.split.c_str() : (",\"move\":" + e2e.move).c_str(),
      match ? "" : ",\"mismatch\":", match ? "" : json_escape(e2e.mismatch).c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (int bad = parse_args(argc, argv, a)) return bad;
  Endpoints ep(a.nodes, a.cut);
  if (ep.cluster()) {
    if (Status s = ep.discover(); !s.ok()) {
      std::fprintf(stderr, "%s: %s\n", kProg, s.error().message.c_str());
      return 1;
    }
  }
  std::vector<Query> queries;
  for (const std::string& name : a.queries) {
    auto q = load_query(name);
    if (!q.ok()) {
      std::fprintf(stderr, "%s: %s\n", kProg, q.error().message.c_str());
      return 2;
    }
    if (a.cut) {
      if (Status s = plan_cut(*q); !s.ok()) {
        std::fprintf(stderr, "%s: %s\n", kProg, s.error().message.c_str());
        return 2;
      }
      if (a.move && q->movable.empty()) {
        std::fprintf(stderr, "%s: --move: %s has no fragment that reads no input stream (one that does cannot move)\n",
                     kProg, name.c_str());
        return 2;
      }
    }
    queries.push_back(std::move(*q));
  }
  auto feed = make_feed(a);
  if (!feed.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProg, feed.error().message.c_str());
    return 2;
  }
  const std::string mode = bench::durability_mode(ep.admin());
  int status = 0;
  for (const Query& q : queries) {
    auto engine = run_engine(q, *feed, a.repeat);
    if (!engine.ok()) {
      std::fprintf(stderr, "%s: %s: %s\n", kProg, q.name.c_str(), engine.error().message.c_str());
      return 1;
    }
    if (a.split_throughput) {
      if (Status s = run_split_throughput(a, ep, q, *feed, *engine); !s.ok()) {
        std::fprintf(stderr, "%s: %s: %s\n", kProg, q.name.c_str(), s.error().message.c_str());
        return 1;
      }
      continue;
    }
    const double load = loadavg_1m();
    auto e2e = run_e2e(a, ep, q, *feed, *engine);
    if (!e2e.ok()) {
      std::fprintf(stderr, "%s: %s: %s\n", kProg, q.name.c_str(), e2e.error().message.c_str());
      return 1;
    }
    print_line(a, ep, mode, q, *feed, *engine, *e2e, load);
    if (!e2e->mismatch.empty()) status = 1;
  }
  return status;
}
