// A fragment split by key groups while it runs (docs/cluster.md,
// "Splitting a fragment"): POST /v1/queries/{query}/fragments/{fragment}/split
// {"parts": [{"node": N, "range": [BEGIN, END]}, ...]}.
//
// The split rewrites the query's cut (engine::split_fragment): in the
// fragment's place a router (a split box in hash mode, on the fragment's
// node, reading its input), one part per range (a copy of its boxes, on
// the part's node) and a merge (a merge box in union mode, on the
// fragment's node, writing the fragment's outputs). It is made at the
// point where the fragment stops: its state then (input positions, output
// sequence numbers, executor snapshot; QueryRunner::stopped_state) seeds
// the new fragments: the router starts at the fragment's input positions
// with its input clock, each part with the state of its key groups only
// (engine::carry_snapshot), the merge fresh but continuing the outputs'
// sequence numbers. Since the merged rows are the fragment's rows in the
// same order (engine/splits.h), the outputs go on with no gap and no
// repeat. Each new fragment checkpoints that seed at once into its own
// state stream, from which it recovers and fails over like any fragment.
//
// Exactly once across a failure of the split itself: while it runs the
// query's entry says "splitting", so no node runs or takes over the
// stopped fragment meanwhile. Until the merge runs, a failure deletes what
// was deployed and runs the fragment again from its own state stream
// (nothing of its outputs was written by anyone else). The split runs on
// its own thread, one at a time per node, since it waits on other nodes.

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <set>
#include <optional>
#include <variant>
#include <thread>

#include "broker/detail/json_out.h"
#include "broker/detail/node_calls.h"
#include "broker/detail/node_impl.h"
#include "cluster/catalog.h"
#include "cluster/membership.h"
#include "engine/splits.h"
#include "federation/peering.h"
#include "rapidjson/document.h"

namespace entente::broker::detail {
namespace {

using namespace node_calls;

using Clock = std::chrono::steady_clock;

constexpr auto kDeployWait = std::chrono::seconds(30);      // one fragment's PUT
constexpr auto kCheckpointWait = std::chrono::seconds(30);  // a new fragment's first checkpoint
constexpr size_t kMaxQueuedSplits = 4;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string hex_of(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::optional<std::string> bytes_of_hex(std::string_view hex) {
  if (hex.size() % 2) return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

namespace {

// The body of POST .../split: {"parts": [{"node", "range"?}, ...]}; parts
// without ranges get equal ones (all or none may have one).
Result<std::vector<engine::SplitPartSpec>> read_split_request(std::string_view body) {
  auto bad = [](std::string why) { return make_error(Errc::invalid_argument, std::move(why)); };
  rapidjson::Document d;
  d.Parse(body.data(), body.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("parts") || !d["parts"].IsArray())
    return bad("$.parts: the parts to split the fragment into are required: [{\"node\": \"n2\", \"range\": [0, 64]}, "
               "...] (without ranges: equal ones)");
  for (auto it = d.MemberBegin(); it != d.MemberEnd(); ++it)
    if (std::string_view(it->name.GetString()) != "parts")
      return bad("$." + std::string(it->name.GetString()).substr(0, 64) + ": unknown field");
  const auto& parts = d["parts"];
  if (parts.Size() < engine::kMinSplitParts || parts.Size() > engine::kMaxSplitParts)
    return bad("$.parts: a split has " + std::to_string(engine::kMinSplitParts) + " to " +
               std::to_string(engine::kMaxSplitParts) + " parts, not " + std::to_string(parts.Size()));
  std::vector<std::string> nodes;
  std::vector<engine::SplitPartSpec> out;
  size_t with_range = 0;
  for (rapidjson::SizeType i = 0; i < parts.Size(); ++i) {
    const std::string at = "$.parts[" + std::to_string(i) + "]";
    const auto& p = parts[i];
    if (!p.IsObject() || !p.HasMember("node") || !p["node"].IsString() || p["node"].GetStringLength() == 0 ||
        p["node"].GetStringLength() > 64)
      return bad(at + ".node: the part's node (a string of 1 to 64 characters) is required");
    for (auto it = p.MemberBegin(); it != p.MemberEnd(); ++it) {
      const std::string_view key = it->name.GetString();
      if (key != "node" && key != "range") return bad(at + "." + std::string(key).substr(0, 64) + ": unknown field");
    }
    nodes.emplace_back(p["node"].GetString());
    engine::SplitPartSpec spec{p["node"].GetString(), {}};
    if (p.HasMember("range")) {
      const auto& r = p["range"];
      if (!r.IsArray() || r.Size() != 2 || !r[0].IsUint() || !r[1].IsUint())
        return bad(at + ".range: expected [begin, end], key groups 0 to " + std::to_string(engine::kKeyGroups));
      spec.range = {r[0].GetUint(), r[1].GetUint()};
      ++with_range;
    }
    out.push_back(std::move(spec));
  }
  if (with_range == 0) return engine::equal_split_parts(nodes);
  if (with_range != out.size())
    return bad("$.parts: give every part a range, or none (equal ranges)");
  return out;
}

// The split of fragment `fragment` of `query`, from the body its
// coordinator stored (its network, reads and writes): the rewritten cut
// and each new fragment's PUT body (without seed), in pipeline order.
struct SplitPlan {
  engine::FragmentSplit split;
  engine::QueryCut cut;
  engine::QueryNetwork fragment_network;  // the fragment as it runs now
  std::vector<std::pair<std::string, std::string>> bodies;  // fragment name, PUT body
};

// 400 for the parts, 409 for the fragment (what it is cannot be split).
struct PlanError {
  int status;
  std::string detail;
};

std::variant<SplitPlan, PlanError> plan_split(const std::string& query, const std::string& fragment,
                                              const std::string& node, const std::string& body,
                                              const std::vector<engine::SplitPartSpec>& parts) {
  rapidjson::Document b;
  b.Parse(body.data(), body.size());
  if (b.HasParseError() || !b.IsObject() || !b.HasMember("network") || !b["network"].IsObject())
    return PlanError{409, "the query's catalog entry has no body for fragment " + fragment};
  std::map<std::string, std::string> reads;  // internal stream -> producer's node
  if (b.HasMember("reads") && b["reads"].IsArray())
    for (const auto& r : b["reads"].GetArray())
      if (r.IsObject() && r.HasMember("stream") && r["stream"].IsString() && r.HasMember("node") &&
          r["node"].IsString())
        reads[r["stream"].GetString()] = r["node"].GetString();
  SplitPlan plan;
  Diagnostics diag;
  {
    const std::string text = json_text(b["network"]);
    auto net = engine::QueryNetwork::parse(text, diag);
    if (!net.ok()) return PlanError{409, "fragment " + fragment + "'s network does not parse: " + net.error().message};
    plan.fragment_network = std::move(net).value();
  }
  // The fragment as a query of its own named like the query, so that the
  // new fragments and streams are named QUERY--...
  rapidjson::Document n;
  n.CopyFrom(b["network"], n.GetAllocator());
  n["name"].SetString(query.c_str(), static_cast<rapidjson::SizeType>(query.size()), n.GetAllocator());
  const std::vector<engine::FragmentSpec> placement{{fragment, node, plan.fragment_network.box_ids()}};
  auto split = engine::split_fragment(json_text(n), placement, fragment, parts, diag);
  if (!split.ok()) {
    const bool parts_wrong = !diag.items().empty() && diag.items().front().path.starts_with("$.parts");
    std::string detail = split.error().message;
    if (diag.size() > 1) {
      detail += "; all:";
      for (const auto& item : diag.items()) detail += " " + item.path + ": " + item.message + ";";
    }
    return PlanError{parts_wrong ? 400 : 409, detail};
  }
  // The internal streams the fragment writes for other fragments: the
  // merge writes them on (to the new cut they are outputs), encoded as
  // internal streams are.
  std::set<std::string> internal_writes;
  if (b.HasMember("writes") && b["writes"].IsArray())
    for (const auto& w : b["writes"].GetArray())
      if (w.IsString()) internal_writes.insert(w.GetString());
  plan.split = std::move(split).value();
  auto cut = engine::cut_query(plan.split.network, plan.split.placement, diag, /*connected=*/false);
  if (!cut.ok()) return PlanError{409, cut.error().message};
  plan.cut = std::move(cut).value();
  for (size_t f : plan.cut.pipeline_order) {
    const auto& p = plan.cut.fragments[f];
    JsonOut j;
    j.begin_object().key("network").raw(p.network_json).key("reads").begin_array();
    // The router reads what the fragment read (to the new cut, a query
    // input), where it read it.
    for (const auto& in : p.inputs)
      if (auto r = reads.find(in); r != reads.end())
        j.begin_object().key("stream").str(in).key("node").str(r->second).end_object();
    for (const auto& stream : p.reads)
      for (const auto& a : plan.cut.arcs)
        if (a.stream == stream)
          for (const auto& q : plan.cut.fragments)
            if (q.name == a.from_fragment)
              j.begin_object().key("stream").str(stream).key("node").str(q.node).end_object();
    j.end_array().key("writes").begin_array();
    for (const auto& w : p.writes) j.str(w);
    for (const auto& o : p.outputs)
      if (internal_writes.count(o)) j.str(o);
    j.end_array().end_object();
    plan.bodies.emplace_back(p.name, j.take());
  }
  return plan;
}

// The fragment whose split, not merged back, made `fragment` (its router,
// a part or its merge), from the query's entry; empty when none.
std::string split_made_of(const std::string& entry_json, const std::string& fragment) {
  rapidjson::Document d;
  d.Parse(entry_json.data(), entry_json.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("splits") || !d["splits"].IsArray()) return {};
  auto is = [&](const rapidjson::Value& v, const char* key) {
    return v.HasMember(key) && v[key].IsString() && v[key].GetString() == fragment;
  };
  for (const auto& r : d["splits"].GetArray()) {
    if (!r.IsObject() || r.HasMember("merged_at_ms") || !r.HasMember("fragment") || !r["fragment"].IsString())
      continue;
    bool made = is(r, "router") || is(r, "merge");
    if (r.HasMember("parts") && r["parts"].IsArray())
      for (const auto& p : r["parts"].GetArray()) made = made || (p.IsObject() && is(p, "fragment"));
    if (made) return r["fragment"].GetString();
  }
  return {};
}

// `body` with its seed.
std::string seeded(const std::string& body, const NodeImpl::FragmentOf::Seed& seed) {
  return body.substr(0, body.size() - 1) + ",\"seed\":" + fragment_seed_json(seed) + "}";
}

}  // namespace

std::string fragment_seed_json(const NodeImpl::FragmentOf::Seed& seed) {
  JsonOut j;
  j.begin_object().key("positions").begin_array();
  for (auto p : seed.state.positions) j.u64(p);
  j.end_array().key("out_next").begin_array();
  for (auto o : seed.state.out_next) j.u64(o);
  j.end_array().key("snapshot").str(hex_of(seed.state.snapshot)).key("adopt").begin_array();
  for (const auto& a : seed.adopt) j.str(a);
  j.end_array().end_object();
  return j.take();
}

Result<std::shared_ptr<const NodeImpl::FragmentOf::Seed>> read_fragment_seed(std::string_view json) {
  auto bad = [](std::string why) { return make_error(Errc::invalid_argument, "$.seed" + why); };
  rapidjson::Document d;
  d.Parse(json.data(), json.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("positions") || !d["positions"].IsArray() ||
      !d.HasMember("out_next") || !d["out_next"].IsArray() || !d.HasMember("snapshot") || !d["snapshot"].IsString() ||
      !d.HasMember("adopt") || !d["adopt"].IsArray() || d.MemberCount() != 4)
    return bad(": expected {\"positions\", \"out_next\", \"snapshot\", \"adopt\"}");
  auto seed = std::make_shared<NodeImpl::FragmentOf::Seed>();
  for (const auto& p : d["positions"].GetArray()) {
    if (!p.IsUint64() || p.GetUint64() == 0) return bad(".positions: expected sequence numbers (1 or more)");
    seed->state.positions.push_back(p.GetUint64());
  }
  for (const auto& o : d["out_next"].GetArray()) {
    if (!o.IsUint64() || o.GetUint64() == 0) return bad(".out_next: expected sequence numbers (1 or more)");
    seed->state.out_next.push_back(o.GetUint64());
  }
  for (const auto& a : d["adopt"].GetArray()) {
    if (!a.IsString()) return bad(".adopt: expected stream names");
    seed->adopt.insert(a.GetString());
  }
  if (d["snapshot"].GetStringLength() > 2 * kMaxSeedSnapshotBytes)
    return bad(".snapshot: larger than " + std::to_string(kMaxSeedSnapshotBytes >> 20) + " MiB");
  auto bytes = bytes_of_hex({d["snapshot"].GetString(), d["snapshot"].GetStringLength()});
  if (!bytes) return bad(".snapshot: expected lowercase hex");
  seed->state.snapshot = std::move(*bytes);
  return std::shared_ptr<const NodeImpl::FragmentOf::Seed>(std::move(seed));
}

std::string NodeImpl::split_records_json(const rapidjson::Value& splits) {
  if (!splits.IsArray()) return "[]";
  rapidjson::Document d;
  d.CopyFrom(splits, d.GetAllocator());
  for (auto& s : d.GetArray())
    if (s.IsObject()) s.RemoveMember("original");
  return json_text(d);
}

void NodeImpl::split_fragment_route(const http::Request& req, const PathParams& params, const http::Respond& answer) {
  const std::string& query = params.at(0);
  const std::string& fragment = params.at(1);
  if (!catalog_ || !membership_ || !peering_) {
    answer(http::Response::problem(409, "Conflict", "splitting a fragment needs a domain of several nodes (a "
                                                    "`cluster` and a `federation` section)"));
    return;
  }
  auto parts = read_split_request(req.body);
  if (!parts.ok()) {
    answer(http::Response::problem(400, "Bad Request", parts.error().message));
    return;
  }
  auto entry = cut_entry(query, true);
  if (!entry) {
    answer(http::Response::problem(404, "Not Found", "no query '" + query.substr(0, 100) + "' cut into fragments in "
                                                     "domain " + config_.domain));
    return;
  }
  std::string from;
  for (const auto& [f, n] : entry->fragments)
    if (f == fragment) from = n;
  if (from.empty()) {
    std::string known;
    for (const auto& [f, _] : entry->fragments) known += (known.empty() ? "" : ", ") + f;
    answer(http::Response::problem(404, "Not Found", "query '" + query + "' has no fragment '" +
                                                     fragment.substr(0, 64) + "' (its fragments: " + known + ")"));
    return;
  }
  if (entry->state != "running") {
    answer(http::Response::problem(409, "Conflict", "query '" + query + "' is " + entry->state +
                                                    "; a fragment is split only while the query runs"));
    return;
  }
  if (auto refused = refuse_if_held(*entry, "splitting fragment " + fragment)) {
    answer(std::move(*refused));
    return;
  }
  if (const std::string of = split_made_of(entry->json, fragment); !of.empty()) {
    answer(http::Response::problem(409, "Conflict", "fragment " + fragment + " is the router, a part or the merge "
                                                    "of the split of fragment " + of + ": merge " + of +
                                                    " back before splitting again"));
    return;
  }
  const cluster::MembershipView view = membership_->view();
  for (size_t i = 0; i < parts->size(); ++i) {
    const std::string& node = (*parts)[i].node;
    auto member = std::find_if(view.members.begin(), view.members.end(),
                               [&](const cluster::Member& m) { return m.record.node == node; });
    if (member == view.members.end()) {
      std::string known;
      for (const auto& m : view.members) known += (known.empty() ? "" : ", ") + m.record.node;
      answer(http::Response::problem(400, "Bad Request", "$.parts[" + std::to_string(i) + "].node: " +
                                                         node.substr(0, 64) + " is not a node of domain " +
                                                         config_.domain + " (its nodes: " + known + ")"));
      return;
    }
    if (!member->up) {
      answer(http::Response::problem(503, "Service Unavailable", "$.parts[" + std::to_string(i) + "].node: " + node +
                                                                 " is down; nothing split"));
      return;
    }
  }
  // The split runs on the fragment's node.
  if (from != config_.node) {
    forward(req, from, answer);
    return;
  }
  auto q = find_query(engine::fragment_network_name(query, fragment));
  if (!q) {
    answer(http::Response::problem(409, "Conflict", "fragment " + fragment + " of query '" + query +
                                                    "' is placed on " + from + " but does not run there now; "
                                                    "nothing split"));
    return;
  }
  // Refused now, with the reason, rather than after queueing.
  const std::string body = fragment_body_of(q->meta());
  auto plan = plan_split(query, fragment, from, body, *parts);
  if (auto* e = std::get_if<PlanError>(&plan)) {
    answer(http::Response::problem(e->status, e->status == 400 ? "Bad Request" : "Conflict", e->detail));
    return;
  }
  enqueue_split(SplitJob{false, query, fragment, std::move(*parts), sub_request(req, "GET", "/", ""), answer});
}

void NodeImpl::enqueue_split(SplitJob job) {
  const std::string& query = job.query;
  const std::string& fragment = job.fragment;
  const http::Respond answer = job.answer;
  std::lock_guard lock(split_mu_);
  const std::string key = query + "/" + fragment;
  if (split_stopping_) {
    answer(http::Response::problem(503, "Service Unavailable", config_.node + " is stopping; nothing split"));
    return;
  }
  if (splitting_.count(key)) {
    answer(http::Response::problem(409, "Conflict", "fragment " + fragment + " of query '" + query +
                                                    "' is being split or merged already"));
    return;
  }
  if (split_queue_.size() >= kMaxQueuedSplits) {
    answer(http::Response::problem(503, "Service Unavailable", std::to_string(kMaxQueuedSplits) +
                                                               " splits wait on " + config_.node + " already; retry "
                                                               "later"));
    return;
  }
  splitting_.insert(key);
  split_queue_.push_back(std::move(job));
  if (!split_thread_.joinable()) split_thread_ = std::thread([this] { split_loop(); });
  split_cv_.notify_one();
}

void NodeImpl::split_loop() {
  for (;;) {
    SplitJob job;
    {
      std::unique_lock lock(split_mu_);
      split_cv_.wait(lock, [this] { return split_stopping_ || !split_queue_.empty(); });
      if (split_stopping_) {
        for (auto& left : split_queue_)
          left.answer(http::Response::problem(503, "Service Unavailable", config_.node + " is stopping; nothing "
                                                                          "split"));
        split_queue_.clear();
        return;
      }
      job = std::move(split_queue_.front());
      split_queue_.pop_front();
    }
    http::Response r = job.merge ? run_merge(job) : run_split(job);
    {
      std::lock_guard lock(split_mu_);
      splitting_.erase(job.query + "/" + job.fragment);
    }
    job.answer(std::move(r));
  }
}

void NodeImpl::stop_splits() {
  {
    std::lock_guard lock(split_mu_);
    split_stopping_ = true;
  }
  split_cv_.notify_all();
  if (split_thread_.joinable()) split_thread_.join();
}

namespace {

}  // namespace

// Compare-and-set of the query's entry through `edit` (false from it: no
// change), a few tries. False when it could not be written.
bool edit_query_entry(cluster::Catalog& catalog, const std::string& query,
                      const std::function<bool(rapidjson::Document&)>& edit, int64_t wait_ms) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto e = catalog.get("queries/" + query);
    if (!e) return false;
    rapidjson::Document d;
    d.Parse(e->value.data(), e->value.size());
    if (d.HasParseError() || !d.IsObject()) return false;
    if (!edit(d)) return false;
    auto rev = catalog.update(e->key, json_text(d), e->mod_revision);
    if (rev.ok()) {
      catalog.wait_for(*rev, wait_ms);
      return true;
    }
  }
  return false;
}

void set_member(rapidjson::Document& d, const char* key, rapidjson::Value v) {
  d.RemoveMember(key);
  d.AddMember(rapidjson::StringRef(key), v, d.GetAllocator());
}

namespace {

// The fragment `name` of the split's cut (split_fragment named them all).
const engine::FragmentPlan& plan_of(const SplitPlan& plan, const std::string& name) {
  for (const auto& f : plan.cut.fragments)
    if (f.name == name) return f;
  throw std::logic_error("no fragment " + name);
}

// Where the split places fragment `name` (`fallback`: the split one's node).
std::string node_of(const engine::FragmentSplit& split, const std::string& name, const std::string& fallback) {
  for (const auto& f : split.placement)
    if (f.name == name) return f.node;
  return fallback;
}

using SeedPtr = std::shared_ptr<NodeImpl::FragmentOf::Seed>;

// The new fragments' seeds from the split fragment's state (`meta`: its
// runner's): the router continues its input positions and clock, each
// part holds its key groups, the merge continues its outputs.
Result<std::map<std::string, SeedPtr>> split_seeds(const SplitPlan& plan, const QueryRunner::State& state,
                                                   const QueryMeta& meta) {
  const engine::FragmentSplit& split = plan.split;
  std::map<std::string, SeedPtr> seeds;
  const auto& router = plan_of(plan, split.router_fragment);
  auto snap = engine::carry_snapshot(plan.fragment_network, state.snapshot, router.network, {}, nullptr);
  if (!snap.ok()) return make_error(snap.error().code, "the router's state: " + snap.error().message);
  auto r = std::make_shared<NodeImpl::FragmentOf::Seed>();
  r->state = {state.positions, std::vector<uint64_t>(router.network.outputs().size(), 1), std::move(*snap)};
  seeds[split.router_fragment] = r;
  for (size_t i = 0; i < split.parts.size(); ++i) {
    const auto& part = plan_of(plan, split.part_fragments[i]);
    auto ps = engine::carry_snapshot(plan.fragment_network, state.snapshot, part.network, split.part_boxes[i],
                                     &split.parts[i].range);
    if (!ps.ok()) return make_error(ps.error().code, "part " + std::to_string(i) + "'s state: " + ps.error().message);
    if (ps->size() > kMaxSeedSnapshotBytes)
      return make_error(Errc::limit_exceeded, "part " + std::to_string(i) + "'s state is " +
                                                  std::to_string(ps->size()) + " bytes; a split ships at most " +
                                                  std::to_string(kMaxSeedSnapshotBytes >> 20) + " MiB per part "
                                                  "(its state travels in the part's deploy request)");
    auto p = std::make_shared<NodeImpl::FragmentOf::Seed>();
    p->state = {std::vector<uint64_t>(part.network.inputs().size(), 1),
                std::vector<uint64_t>(part.network.outputs().size(), 1), std::move(*ps)};
    seeds[split.part_fragments[i]] = p;
  }
  const auto& merge = plan_of(plan, split.merge_fragment);
  auto m = std::make_shared<NodeImpl::FragmentOf::Seed>();
  m->state.positions.assign(merge.network.inputs().size(), 1);
  for (const auto& o : merge.network.outputs()) {
    auto at = std::find(meta.outputs.begin(), meta.outputs.end(), o.name);
    if (at == meta.outputs.end())
      return make_error(Errc::invalid_argument, "the merge writes '" + o.name + "', which the fragment did not");
    m->state.out_next.push_back(state.out_next[static_cast<size_t>(at - meta.outputs.begin())]);
    m->adopt.insert(o.name);
  }
  seeds[split.merge_fragment] = m;
  return seeds;
}

// The query's entry `d` once fragment `fragment` (on `node`) is split: the
// new fragments with their bodies in its place, their arcs, the split
// recorded (with the fragment's own entry, which a merge restores),
// running again. False when the entry has no such fragment.
bool record_split(rapidjson::Document& d, const SplitPlan& plan, const std::string& fragment,
                  const std::string& node) {
  const engine::FragmentSplit& split = plan.split;
  const auto& parts = split.parts;
  auto& a = d.GetAllocator();
  if (!d.HasMember("fragments") || !d["fragments"].IsArray()) return false;
  rapidjson::Value fragments(rapidjson::kArrayType);
  rapidjson::Value original;
  for (auto& f : d["fragments"].GetArray()) {
    if (!f.IsObject() || !f.HasMember("name") || !f["name"].IsString() || f["name"].GetString() != fragment) {
      fragments.PushBack(rapidjson::Value(f, a), a);
      continue;
    }
    original.CopyFrom(f, a);
    for (const auto& [name, fbody] : plan.bodies) {
      rapidjson::Value e(rapidjson::kObjectType), boxes(rapidjson::kArrayType), b;
      for (const auto& id : plan_of(plan, name).network.box_ids()) boxes.PushBack(rapidjson::Value(id.c_str(), a), a);
      rapidjson::Document parsed;
      parsed.Parse(fbody.data(), fbody.size());
      b.CopyFrom(parsed, a);
      e.AddMember("name", rapidjson::Value(name.c_str(), a), a)
          .AddMember("node", rapidjson::Value(node_of(split, name, node).c_str(), a), a)
          .AddMember("boxes", boxes, a)
          .AddMember("body", b, a);
      fragments.PushBack(e, a);
    }
  }
  if (original.IsNull()) return false;
  d["fragments"] = fragments;
  if (d.HasMember("arcs") && d["arcs"].IsArray()) {
    for (auto& arc : d["arcs"].GetArray())
      if (arc.IsObject() && arc.HasMember("to_fragments") && arc["to_fragments"].IsArray())
        for (auto& t : arc["to_fragments"].GetArray())
          if (t.IsString() && t.GetString() == fragment)
            t.SetString(split.router_fragment.c_str(), a);
    for (const auto& arc : plan.cut.arcs) {
      rapidjson::Value v(rapidjson::kObjectType), to(rapidjson::kArrayType);
      for (const auto& t : arc.to_fragments) to.PushBack(rapidjson::Value(t.c_str(), a), a);
      v.AddMember("stream", rapidjson::Value(arc.stream.c_str(), a), a)
          .AddMember("from", rapidjson::Value(arc.from.c_str(), a), a)
          .AddMember("from_fragment", rapidjson::Value(arc.from_fragment.c_str(), a), a)
          .AddMember("to_fragments", to, a);
      d["arcs"].PushBack(v, a);
    }
  }
  rapidjson::Value rec(rapidjson::kObjectType), pv(rapidjson::kArrayType), keys(rapidjson::kArrayType);
  for (size_t i = 0; i < parts.size(); ++i) {
    rapidjson::Value p(rapidjson::kObjectType), range(rapidjson::kArrayType);
    range.PushBack(parts[i].range.begin, a).PushBack(parts[i].range.end, a);
    p.AddMember("fragment", rapidjson::Value(split.part_fragments[i].c_str(), a), a)
        .AddMember("node", rapidjson::Value(parts[i].node.c_str(), a), a)
        .AddMember("range", range, a);
    pv.PushBack(p, a);
  }
  for (const auto& k : split.keys) keys.PushBack(rapidjson::Value(k.c_str(), a), a);
  rec.AddMember("fragment", rapidjson::Value(fragment.c_str(), a), a)
      .AddMember("node", rapidjson::Value(node.c_str(), a), a)
      .AddMember("keyed_box", rapidjson::Value(split.keyed_box.c_str(), a), a)
      .AddMember("keys", keys, a)
      .AddMember("router", rapidjson::Value(split.router_fragment.c_str(), a), a)
      .AddMember("parts", pv, a)
      .AddMember("merge", rapidjson::Value(split.merge_fragment.c_str(), a), a)
      .AddMember("at_ms", rapidjson::Value(static_cast<int64_t>(wall_ms())), a)
      .AddMember("original", original, a);
  if (!d.HasMember("splits") || !d["splits"].IsArray()) set_member(d, "splits", rapidjson::Value(rapidjson::kArrayType));
  d["splits"].PushBack(rec, a);
  set_member(d, "state", rapidjson::Value("running", a));
  return true;
}

// The answer to a split.
std::string split_answer(const std::string& query, const engine::FragmentSplit& split, const std::string& node,
                         const std::map<std::string, SeedPtr>& seeds, bool checkpointed, double pause_ms,
                         double total_ms) {
  JsonOut j;
  j.begin_object();
  j.key("query").str(query).key("fragment").str(split.fragment).key("state").str("split");
  j.key("keyed_box").str(split.keyed_box).key("keys").begin_array();
  for (const auto& k : split.keys) j.str(k);
  j.end_array();
  j.key("router").begin_object().key("fragment").str(split.router_fragment).key("node").str(node).end_object();
  j.key("parts").begin_array();
  for (size_t i = 0; i < split.parts.size(); ++i) {
    j.begin_object().key("fragment").str(split.part_fragments[i]).key("node").str(split.parts[i].node);
    j.key("range").begin_array().u64(split.parts[i].range.begin).u64(split.parts[i].range.end).end_array();
    j.key("state_bytes").u64(seeds.at(split.part_fragments[i])->state.snapshot.size()).end_object();
  }
  j.end_array();
  j.key("merge").begin_object().key("fragment").str(split.merge_fragment).key("node").str(node).end_object();
  j.key("checkpointed").boolean(checkpointed);
  // The outputs were written by nobody from the fragment's stop to the
  // merge's start.
  j.key("pause_ms").dbl(pause_ms).key("total_ms").dbl(total_ms);
  j.end_object();
  return j.take();
}

}  // namespace

std::optional<http::Response> NodeImpl::call_node(const http::Request& req, const std::string& node,
                                                  std::chrono::steady_clock::duration bound) {
  auto answered = std::make_shared<std::promise<http::Response>>();
  auto f = answered->get_future();
  forward(req, node, [answered](http::Response r) { answered->set_value(std::move(r)); });
  if (f.wait_for(bound) != std::future_status::ready) return std::nullopt;
  return f.get();
}

bool NodeImpl::await_checkpoints(const http::Request& caller, const std::string& query,
                                 const std::vector<std::pair<std::string, std::string>>& fragments) {
  bool all = true;
  for (const auto& [name, node] : fragments) {
    const auto until = Clock::now() + kCheckpointWait;
    bool has = false;
    while (!has && Clock::now() < until) {
      if (auto r = call_node(sub_request(caller, "GET", fragment_target(query, name), ""), node,
                             std::chrono::seconds(2))) {
        rapidjson::Document d;
        d.Parse(r->body.data(), r->body.size());
        has = r->status == 200 && d.IsObject() && d.HasMember("checkpoint") && d["checkpoint"].IsObject();
      }
      if (!has) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    all &= has;
  }
  return all;
}

void NodeImpl::drop_split_router(const std::string& runner, const std::vector<std::string>& outputs) {
  if (find_query(runner)) (void)detach_query(runner);
  // Its streams, not the mirror of its input (the fragment reads it).
  std::vector<std::string> streams = outputs;
  streams.push_back(state_stream_name(runner));
  for (const auto& s : streams) {
    (void)discard_stream(s);
    (void)catalog_->erase("streams/" + s);
  }
}

http::Response NodeImpl::run_split(const SplitJob& job) {
  const auto t0 = Clock::now();
  const std::string runner = engine::fragment_network_name(job.query, job.fragment);
  const std::string what = "splitting fragment " + job.fragment + " of query '" + job.query + "'";
  const int64_t etcd_ms = config_.cluster.etcd_timeout_ms;
  auto failed = [&](int status, const std::string& why) {
    log_line(LogLevel::info, "cluster", what + ": " + why);
    return http::Response::problem(status, status == 503 ? "Service Unavailable" : "Conflict", why);
  };
  auto q = find_query(runner);
  if (!q) return failed(409, "the fragment does not run on " + config_.node + " now; nothing split");
  const QueryMeta meta = q->meta();
  const std::string body = fragment_body_of(meta);
  auto planned = plan_split(job.query, job.fragment, config_.node, body, job.parts);
  if (auto* e = std::get_if<PlanError>(&planned)) return failed(e->status, e->detail);
  const SplitPlan& plan = std::get<SplitPlan>(planned);
  const engine::FragmentSplit& split = plan.split;

  // 1. No node runs or takes over the fragment while it is split.
  auto set_state = [&](const std::string& state) {
    return edit_query_entry(*catalog_, job.query, [&](rapidjson::Document& d) {
      set_member(d, "state", rapidjson::Value(state.c_str(), d.GetAllocator()));
      return true;
    }, etcd_ms);
  };
  if (!set_state("splitting")) return failed(503, "the query's catalog entry could not be updated; nothing split");
  // 2. The fragment stops here; its state then seeds the new fragments.
  if (Status st = detach_query(runner); !st.ok()) {
    set_state("running");
    return failed(503, "stopping the fragment: " + st.error().message + "; nothing split");
  }
  const auto t_stop = Clock::now();
  auto rerun = [&](const std::string& why) {
    rerun_fragment(meta, body);
    set_state("running");
    return failed(409, why + "; the fragment runs on " + config_.node + " again, unsplit");
  };
  auto state = q->stopped_state();
  if (!state.ok()) return rerun("the fragment's state: " + state.error().message);
  auto seeds = split_seeds(plan, *state, meta);
  if (!seeds.ok()) return rerun(seeds.error().message);

  // 3. The new fragments, producers first: router, parts, merge. A failure
  // removes those deployed (the merge, which writes the outputs, comes
  // last) and runs the fragment again.
  std::vector<std::pair<std::string, std::string>> deployed;  // fragment, node
  auto undo = [&] {
    for (auto it = deployed.rbegin(); it != deployed.rend(); ++it) {
      if (it->second == config_.node)  // the router, or a part here (it reads no mirror)
        drop_split_router(engine::fragment_network_name(job.query, it->first), plan_of(plan, it->first).writes);
      else (void)call_node(sub_request(job.req, "DELETE", fragment_target(job.query, it->first), ""), it->second,
                           kDeployWait);
    }
  };
  for (const auto& [name, fbody] : plan.bodies) {
    const std::string node = node_of(split, name, config_.node);
    auto r = call_node(sub_request(job.req, "PUT", fragment_target(job.query, name), seeded(fbody, *seeds->at(name))),
                       node, kDeployWait);
    // The merge writes the outputs: if it runs after all (an answer lost
    // or late), the fragment must not run again beside it.
    if (name == split.merge_fragment && !(r && r->status == 201) &&
        find_query(engine::fragment_network_name(job.query, name))) {
      deployed.emplace_back(name, node);
      continue;
    }
    if (!r || r->status != 201) {
      undo();
      return rerun("deploying fragment " + name + " on " + node + ": " +
                   (r ? std::to_string(r->status) + " " + detail_of(*r) : std::string("no answer within 30 s")));
    }
    deployed.emplace_back(name, node);
  }
  const auto t_run = Clock::now();

  // 4. Each new fragment's seed is in its state stream (its first
  // checkpoint) before the entry counts on it: a node taking one over
  // recovers from there.
  const bool checkpointed = await_checkpoints(job.req, job.query, deployed);
  // 5. The entry names the new fragments.
  if (!edit_query_entry(*catalog_, job.query,
                        [&](rapidjson::Document& d) { return record_split(d, plan, job.fragment, config_.node); },
                        etcd_ms)) {
    // The merge writes the outputs now: the fragment cannot come back
    // (its rows would repeat). The entry is left "splitting" for an
    // operator to see (docs/cluster.md, "Splitting a fragment").
    return failed(503, "the new fragments run, but the query's catalog entry could not be updated; it stays "
                       "\"splitting\"");
  }
  // 6. The fragment's state stream goes (its outputs are the merge's now;
  // the mirror of its input is the router's).
  (void)discard_stream(meta.state_stream);
  (void)catalog_->erase("streams/" + meta.state_stream);
  log_line(LogLevel::info, "cluster", what + ": done, paused " + std::to_string(static_cast<int64_t>(ms_between(t_stop, t_run))) + " ms");
  return http::Response::json(200, split_answer(job.query, split, config_.node, *seeds, checkpointed,
                                                ms_between(t_stop, t_run), ms_between(t0, Clock::now())));
}

// ------------------------------------------------------------ merging back

namespace {

// The last split of `fragment` recorded in the entry `d` that is not
// merged yet; null when none.
const rapidjson::Value* split_record(const rapidjson::Document& d, const std::string& fragment) {
  if (!d.IsObject() || !d.HasMember("splits") || !d["splits"].IsArray()) return nullptr;
  const rapidjson::Value* found = nullptr;
  for (const auto& s : d["splits"].GetArray())
    if (s.IsObject() && s.HasMember("fragment") && s["fragment"].IsString() && s["fragment"].GetString() == fragment &&
        !s.HasMember("merged_at_ms") && s.HasMember("original") && s["original"].IsObject())
      found = &s;
  return found;
}

// The position of `runner`'s input reading `stream` (its name, or a
// mirror "@NODE/stream"), from its GET answer; 0 when absent.
uint64_t position_of(const rapidjson::Value& runner, const std::string& stream) {
  if (!runner.IsObject() || !runner.HasMember("positions") || !runner["positions"].IsObject()) return 0;
  for (auto it = runner["positions"].MemberBegin(); it != runner["positions"].MemberEnd(); ++it) {
    const std::string name = it->name.GetString();
    const bool same = name == stream || (name.size() > stream.size() && name.ends_with("/" + stream));
    if (same && it->value.IsUint64()) return it->value.GetUint64();
  }
  return 0;
}

}  // namespace

void NodeImpl::fragment_state_route(const http::Request& req, const PathParams& params, const http::Respond& answer) {
  const std::string runner = engine::fragment_network_name(params.at(0), params.at(1));
  auto q = find_query(runner);
  if (!q) {
    answer(http::Response::problem(404, "Not Found", "no fragment " + params.at(1).substr(0, 40) + " of query '" +
                                                         params.at(0).substr(0, 100) + "' on " + config_.node));
    return;
  }
  rapidjson::Document d;
  d.Parse(req.body.data(), req.body.size());
  const size_t inputs = q->meta().inputs.size();
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("consumed") || !d["consumed"].IsArray() ||
      d["consumed"].Size() != inputs) {
    answer(http::Response::problem(400, "Bad Request", "$.consumed: expected the next sequence number of each of the "
                                                       "fragment's " + std::to_string(inputs) + " inputs"));
    return;
  }
  // Only once it has read that far: its state then is the one the merge
  // joins (its inputs get nothing more).
  const auto positions = q->info().positions;
  for (size_t i = 0; i < inputs; ++i) {
    const auto& c = d["consumed"][static_cast<rapidjson::SizeType>(i)];
    if (!c.IsUint64()) {
      answer(http::Response::problem(400, "Bad Request", "$.consumed[" + std::to_string(i) + "]: expected a sequence "
                                                         "number"));
      return;
    }
    if (positions.at(i) < c.GetUint64()) {
      answer(http::Response::problem(409, "Conflict", "fragment " + params.at(1) + " has read " +
                                                      q->meta().inputs[i] + " up to " +
                                                      std::to_string(positions.at(i)) + ", not yet " +
                                                      std::to_string(c.GetUint64())));
      return;
    }
  }
  auto state = q->stopped_state();
  if (!state.ok()) {
    answer(problem_for(state.error()));
    return;
  }
  FragmentOf::Seed seed;
  seed.state = std::move(state).value();
  if (seed.state.snapshot.size() > kMaxSeedSnapshotBytes) {
    answer(http::Response::problem(409, "Conflict", "fragment " + params.at(1) + "'s state is " +
                                                    std::to_string(seed.state.snapshot.size()) + " bytes; at most " +
                                                    std::to_string(kMaxSeedSnapshotBytes >> 20) + " MiB are shipped"));
    return;
  }
  answer(http::Response::json(200, fragment_seed_json(seed)));
}

void NodeImpl::merge_fragment_route(const http::Request& req, const PathParams& params, const http::Respond& answer) {
  const std::string& query = params.at(0);
  const std::string& fragment = params.at(1);
  if (!catalog_ || !membership_ || !peering_) {
    answer(http::Response::problem(409, "Conflict", "merging a fragment needs a domain of several nodes"));
    return;
  }
  auto entry = cut_entry(query, true);
  if (!entry) {
    answer(http::Response::problem(404, "Not Found", "no query '" + query.substr(0, 100) + "' cut into fragments in "
                                                     "domain " + config_.domain));
    return;
  }
  rapidjson::Document d;
  d.Parse(entry->json.data(), entry->json.size());
  const rapidjson::Value* rec = split_record(d, fragment);
  if (!rec) {
    answer(http::Response::problem(404, "Not Found", "query '" + query + "' has no split fragment '" +
                                                     fragment.substr(0, 64) + "' to merge"));
    return;
  }
  if (entry->state != "running") {
    answer(http::Response::problem(409, "Conflict", "query '" + query + "' is " + entry->state +
                                                    "; a fragment is merged only while the query runs"));
    return;
  }
  if (auto refused = refuse_if_held(*entry, "merging fragment " + fragment)) {
    answer(std::move(*refused));
    return;
  }
  // The merge runs where the router and the merge fragment run.
  const std::string router = (*rec)["router"].GetString();
  const std::string merge = (*rec)["merge"].GetString();
  std::string router_node, merge_node;
  for (const auto& [f, n] : entry->fragments) {
    if (f == router) router_node = n;
    if (f == merge) merge_node = n;
  }
  if (router_node.empty() || router_node != merge_node) {
    answer(http::Response::problem(409, "Conflict", "fragment " + router + " runs on " + router_node + " and " +
                                                    merge + " on " + merge_node + ": they are merged back where "
                                                    "both run"));
    return;
  }
  if (router_node != config_.node) {
    forward(req, router_node, answer);
    return;
  }
  enqueue_split(SplitJob{true, query, fragment, {}, sub_request(req, "GET", "/", ""), answer});
}

namespace {

// The query's entry `doc` once split fragment `fragment` is merged back on
// `node`: the fragment's own entry in the router's place, the parts, the
// router, the merge and their arcs gone, the split marked merged, running
// again. False when the split is not recorded.
bool record_merge(rapidjson::Document& doc, const engine::FragmentSplit& split, const std::string& fragment,
                  const std::string& node) {
  std::set<std::string> gone{split.router_fragment, split.merge_fragment};
  for (const auto& p : split.part_fragments) gone.insert(p);
  auto& a = doc.GetAllocator();
  rapidjson::Value* r = const_cast<rapidjson::Value*>(split_record(doc, fragment));
  if (!r || !doc.HasMember("fragments") || !doc["fragments"].IsArray()) return false;
  rapidjson::Value fragments(rapidjson::kArrayType);
  for (auto& f : doc["fragments"].GetArray()) {
    const std::string name = f.IsObject() && f.HasMember("name") && f["name"].IsString() ? f["name"].GetString() : "";
    if (name == split.router_fragment) {
      rapidjson::Value original((*r)["original"], a);
      original["node"].SetString(node.c_str(), a);
      fragments.PushBack(original, a);
    } else if (!gone.count(name)) {
      fragments.PushBack(rapidjson::Value(f, a), a);
    }
  }
  doc["fragments"] = fragments;
  if (doc.HasMember("arcs") && doc["arcs"].IsArray()) {
    rapidjson::Value arcs(rapidjson::kArrayType);
    for (auto& arc : doc["arcs"].GetArray()) {
      if (arc.IsObject() && arc.HasMember("from_fragment") && arc["from_fragment"].IsString() &&
          gone.count(arc["from_fragment"].GetString()))
        continue;
      if (arc.IsObject() && arc.HasMember("to_fragments") && arc["to_fragments"].IsArray())
        for (auto& t : arc["to_fragments"].GetArray())
          if (t.IsString() && t.GetString() == split.router_fragment) t.SetString(fragment.c_str(), a);
      arcs.PushBack(rapidjson::Value(arc, a), a);
    }
    doc["arcs"] = arcs;
  }
  r->AddMember("merged_at_ms", rapidjson::Value(static_cast<int64_t>(wall_ms())), a);
  r->RemoveMember("original");
  set_member(doc, "state", rapidjson::Value("running", a));
  return true;
}

// The merged fragment's seed: its boxes joined from the parts' states, its
// input clock and positions the router's, its outputs continuing at the
// merge's.
Result<NodeImpl::FragmentOf::Seed> merged_seed(const SplitPlan& plan, const QueryRunner::State& router,
                                               const std::vector<QueryRunner::State>& parts,
                                               const QueryRunner::State& merge, const QueryMeta& merge_meta) {
  const engine::FragmentSplit& split = plan.split;
  std::vector<engine::SnapshotPart> sp;
  for (size_t i = 0; i < split.parts.size(); ++i)
    sp.push_back({&plan_of(plan, split.part_fragments[i]).network, parts[i].snapshot, &split.part_boxes[i],
                  split.parts[i].range});
  auto joined = engine::join_snapshots(plan.fragment_network, plan_of(plan, split.router_fragment).network,
                                       router.snapshot, sp);
  if (!joined.ok()) return make_error(joined.error().code, "joining the parts' states: " + joined.error().message);
  NodeImpl::FragmentOf::Seed seed;
  seed.state.positions = router.positions;
  seed.state.snapshot = std::move(*joined);
  for (const auto& o : plan.fragment_network.outputs()) {
    auto at = std::find(merge_meta.outputs.begin(), merge_meta.outputs.end(), o.name);
    if (at == merge_meta.outputs.end())
      return make_error(Errc::invalid_argument, "the merge does not write '" + o.name + "'");
    seed.state.out_next.push_back(merge.out_next[static_cast<size_t>(at - merge_meta.outputs.begin())]);
    seed.adopt.insert(o.name);
  }
  return seed;
}

// Waits (up to 30 s) until the merge has read each part's stream up to
// what the part wrote (parts[i].out_next).
bool await_merge_drained(QueryRunner& merge, const SplitPlan& plan, const std::vector<QueryRunner::State>& parts) {
  const QueryMeta& meta = merge.meta();
  std::vector<uint64_t> targets(meta.inputs.size(), 0);
  for (size_t i = 0; i < plan.split.parts.size(); ++i) {
    const std::string& stream = plan_of(plan, plan.split.part_fragments[i]).writes.at(0);
    for (size_t k = 0; k < meta.inputs.size(); ++k)
      if (meta.inputs[k] == stream || meta.inputs[k].ends_with("/" + stream)) targets[k] = parts[i].out_next.at(0);
  }
  auto caught_up = [&] {
    const auto positions = merge.info().positions;
    for (size_t k = 0; k < targets.size(); ++k)
      if (positions.at(k) < targets[k]) return false;
    return true;
  };
  for (const auto until = Clock::now() + kCheckpointWait; !caught_up() && Clock::now() < until;)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return caught_up();
}

}  // namespace

Result<QueryRunner::State> NodeImpl::drained_part_state(const http::Request& caller, const std::string& query,
                                                        const std::string& part, const std::string& node,
                                                        const std::vector<std::pair<std::string, uint64_t>>& reads) {
  const std::string path = fragment_target(query, part);
  const auto until = Clock::now() + kCheckpointWait;
  for (bool read = false; !read;) {
    if (Clock::now() >= until)
      return make_error(Errc::unavailable, "part " + part + " on " + node + " did not read all the router sent it "
                                           "within 30 s");
    if (auto r = call_node(sub_request(caller, "GET", path, ""), node, std::chrono::seconds(5))) {
      rapidjson::Document g;
      g.Parse(r->body.data(), r->body.size());
      read = r->status == 200 && std::all_of(reads.begin(), reads.end(), [&](const auto& st) {
               return position_of(g, st.first) >= st.second;
             });
    }
    if (!read) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string consumed;
  for (const auto& [stream, target] : reads) consumed += (consumed.empty() ? "" : ",") + std::to_string(target);
  auto r = call_node(sub_request(caller, "POST", path + "/state", "{\"consumed\":[" + consumed + "]}"), node,
                     kDeployWait);
  if (!r || r->status != 200)
    return make_error(Errc::unavailable, "part " + part + "'s state: " + (r ? detail_of(*r) : "no answer"));
  auto seed = read_fragment_seed(r->body);
  if (!seed.ok()) return make_error(seed.error().code, "part " + part + "'s state: " + seed.error().message);
  return (*seed)->state;
}

http::Response NodeImpl::run_merge(const SplitJob& job) {
  const auto t0 = Clock::now();
  const std::string what = "merging fragment " + job.fragment + " of query '" + job.query + "' back";
  const int64_t etcd_ms = config_.cluster.etcd_timeout_ms;
  auto failed = [&](int status, const std::string& why) {
    log_line(LogLevel::info, "cluster", what + ": " + why);
    return http::Response::problem(status, status == 503 ? "Service Unavailable" : "Conflict", why);
  };
  auto entry = cut_entry(job.query, true);
  if (!entry) return failed(409, "the query's entry is gone");
  rapidjson::Document d;
  d.Parse(entry->json.data(), entry->json.size());
  const rapidjson::Value* rec = split_record(d, job.fragment);
  if (!rec) return failed(409, "the split is not recorded any more");
  const std::string original_body = json_text((*rec)["original"]["body"]);
  std::vector<engine::SplitPartSpec> specs;
  for (const auto& p : (*rec)["parts"].GetArray())
    specs.push_back({p["node"].GetString(), {p["range"][0].GetUint(), p["range"][1].GetUint()}});
  // The same rewrite again (deterministic): the names and networks of the
  // router, parts and merge.
  auto planned = plan_split(job.query, job.fragment, config_.node, original_body, specs);
  if (auto* e = std::get_if<PlanError>(&planned)) return failed(409, "the split cannot be replanned: " + e->detail);
  const SplitPlan& plan = std::get<SplitPlan>(planned);
  const engine::FragmentSplit& split = plan.split;
  const std::string router_runner = engine::fragment_network_name(job.query, split.router_fragment);
  const std::string merge_runner = engine::fragment_network_name(job.query, split.merge_fragment);
  auto router_q = find_query(router_runner);
  auto merge_q = find_query(merge_runner);
  if (!router_q || !merge_q) return failed(409, "the router or the merge does not run on " + config_.node + " now");
  const QueryMeta router_meta = router_q->meta(), merge_meta = merge_q->meta();
  const std::string router_body = fragment_body_of(router_meta), merge_body = fragment_body_of(merge_meta);

  auto set_state = [&](const std::string& state) {
    return edit_query_entry(*catalog_, job.query, [&](rapidjson::Document& doc) {
      set_member(doc, "state", rapidjson::Value(state.c_str(), doc.GetAllocator()));
      return true;
    }, etcd_ms);
  };
  if (!set_state("merging")) return failed(503, "the query's catalog entry could not be updated; nothing merged");
  bool merge_stopped = false;
  auto rollback = [&](const std::string& why) {
    rerun_fragment(router_meta, router_body);
    if (merge_stopped) rerun_fragment(merge_meta, merge_body);
    set_state("running");
    return failed(409, why + "; the parts run on, split");
  };
  // 1. The router stops: the parts get nothing more.
  if (Status st = detach_query(router_runner); !st.ok()) {
    set_state("running");
    return failed(503, "stopping the router: " + st.error().message + "; nothing merged");
  }
  const auto t_stop = Clock::now();
  auto rstate = router_q->stopped_state();
  if (!rstate.ok()) return rollback("the router's state: " + rstate.error().message);

  // 2. Each part, once it has read all the router sent it: its state.
  std::vector<QueryRunner::State> part_states;
  for (size_t i = 0; i < split.parts.size(); ++i) {
    // (A part's inputs are the router's streams for it: one, or a split
    // join's two, one per side.)
    std::vector<std::pair<std::string, uint64_t>> reads;
    for (const auto& in : plan_of(plan, split.part_fragments[i]).network.inputs()) {
      const auto at = std::find(router_meta.outputs.begin(), router_meta.outputs.end(), in.name);
      if (at == router_meta.outputs.end()) return rollback("the router does not write " + in.name);
      reads.emplace_back(in.name, rstate->out_next[static_cast<size_t>(at - router_meta.outputs.begin())]);
    }
    auto st = drained_part_state(job.req, job.query, split.part_fragments[i], split.parts[i].node, reads);
    if (!st.ok()) return rollback(st.error().message);
    part_states.push_back(std::move(*st));
  }
  // 3. The merge, once it has read all the parts wrote, stops.
  if (!await_merge_drained(*merge_q, plan, part_states))
    return rollback("the merge did not read all the parts wrote within 30 s");
  if (Status st = detach_query(merge_runner); !st.ok()) return rollback("stopping the merge: " + st.error().message);
  merge_stopped = true;
  auto mstate = merge_q->stopped_state();
  if (!mstate.ok()) return rollback("the merge's state: " + mstate.error().message);

  // 4. The fragment runs again, here, from the parts' joined states.
  auto seed = merged_seed(plan, *rstate, part_states, *mstate, merge_meta);
  if (!seed.ok()) return rollback(seed.error().message);
  const std::string runner = engine::fragment_network_name(job.query, job.fragment);
  auto put = call_node(sub_request(job.req, "PUT", fragment_target(job.query, job.fragment),
                                   seeded(original_body, *seed)),
                       config_.node, kDeployWait);
  // (Running after all, its answer lost: the merge must not run again.)
  if (!(put && put->status == 201) && !find_query(runner))
    return rollback("deploying fragment " + job.fragment + ": " + (put ? detail_of(*put) : "no answer within 30 s"));
  const auto t_run = Clock::now();
  const bool checkpointed = await_checkpoints(job.req, job.query, {{job.fragment, config_.node}});

  // 5. The entry gets the fragment back.
  if (!edit_query_entry(*catalog_, job.query,
                        [&](rapidjson::Document& doc) { return record_merge(doc, split, job.fragment, config_.node); },
                        etcd_ms))
    return failed(503, "the fragment runs again, but the query's catalog entry could not be updated; it stays "
                       "\"merging\"");
  // 6. What the split made goes: the merge's reads and state stream, the
  // parts (each on its node), the router's streams.
  for (const auto& in : merge_meta.inputs)
    if (in.starts_with("@")) (void)delete_import(in);
  (void)discard_stream(merge_meta.state_stream);
  (void)catalog_->erase("streams/" + merge_meta.state_stream);
  for (size_t i = 0; i < split.parts.size(); ++i)
    (void)call_node(sub_request(job.req, "DELETE", fragment_target(job.query, split.part_fragments[i]), ""),
                    split.parts[i].node, kDeployWait);
  drop_split_router(router_runner, router_meta.outputs);

  JsonOut j;
  j.begin_object();
  j.key("query").str(job.query).key("fragment").str(job.fragment).key("state").str("merged");
  j.key("node").str(config_.node).key("checkpointed").boolean(checkpointed);
  // From the router's stop to the fragment's run: the parts and the merge
  // finished what they had meanwhile.
  j.key("pause_ms").dbl(ms_between(t_stop, t_run)).key("total_ms").dbl(ms_between(t0, Clock::now()));
  j.end_object();
  log_line(LogLevel::info, "cluster", what + ": done, paused " + std::to_string(static_cast<int64_t>(ms_between(t_stop, t_run))) + " ms");
  return http::Response::json(200, j.take());
}

}  // namespace entente::broker::detail
