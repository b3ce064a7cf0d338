// A fragment run by a node of another domain under a hosting contract
// (docs/cluster.md, "Moving a fragment to another domain"). The admission
// (the contract, the host's own check of the offer) is cluster_hosting.cpp;
// this is the run that follows.
//
// The owner keeps the fragment's logs. Its outputs and its state stream
// stay streams of the owner's domain, led where they were, with the same
// sequence numbers; the host computes and sends its results back:
//
//   1. The owner grants the host domain reads of the fragment's inputs
//      (catalog keys hosted-reads/HOST/STREAM, which every node of the
//      domain honours: federation::Host::may_read_hosted), marks the
//      fragment "hosted" in the query's entry (so no node of the domain
//      runs it meanwhile), and stops its runner where it stands
//      (QueryRunner::stopped_state: input positions, output sequence
//      numbers, executor snapshot, journal and checkpoint numbers).
//   2. It sends that state (hosting.chunk, in pieces) and the fragment's
//      declarative definition (hosting.run) to the host. The host checks
//      the contract again, imports the owner's streams the fragment reads
//      as hidden copies, creates hidden streams for its outputs and state
//      stream that start at the owner's next sequence numbers, and runs the
//      fragment from the state, continuing its journal.
//   3. The owner imports the hidden streams (its grant: the run is its) and
//      the relay appends what arrives to the fragment's own outputs and
//      state stream at the same sequence numbers: to subscribers and
//      downstream fragments the outputs go on with no gap and no repeat.
//      The pause is from the stop to the host's answer.
//   4. Taking it back (a move back, the contract out of force, the host's
//      link down for kHostLost): hosting.end stops the host's run and says
//      where its streams end; the relay appends all of it; the fragment
//      runs here again, recovering from its own state stream, which now
//      ends with the host's checkpoints and journal.
//
// Nothing is lost or repeated when the host dies, because the host's
// runner appends an output only once the owner has acknowledged the
// journal entries that led to it (its Env::when_replicated waits on the
// owner's acknowledgements), and the owner recovers only after the relay
// appended everything its copies hold: every output the owner holds has
// its journal in the owner's state stream, and the recovery replays the
// journal, dropping the outputs already there.
//
// Privacy on the host: the hosted runner is no query of the host, and its
// streams (the copies of the owner's streams, its outputs and state
// stream) are no streams of the host: the host's API cannot list, read,
// subscribe to, export or query them; only the owner's domain may read the
// outputs and state stream, through the peer link.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <string>

#include "broker/detail/hosted_calls.h"
#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "cluster/catalog.h"
#include "contracts/canonical.h"
#include "contracts/contract.h"
#include "contracts/hosting.h"
#include "contracts/ledger.h"
#include "contracts/terms.h"
#include "engine/codec.h"
#include "engine/fragments.h"
#include "engine/network.h"
#include "federation/contracting.h"
#include "federation/hosting.h"
#include "federation/imports.h"
#include "federation/peering.h"
#include "rapidjson/document.h"
#include "store/stream_log.h"

namespace entente::broker::detail {
namespace {

using namespace hosted;

constexpr size_t kChunkBytes = 96u << 10;  // of snapshot per hosting.chunk (hex: twice that)
constexpr size_t kMaxHostedSnapshot = 64u << 20;
constexpr size_t kMaxHostedChunkBytes = 128u << 20;  // of states arriving, on a host, at once
constexpr auto kDrainWait = std::chrono::seconds(10);
constexpr auto kHostLost = std::chrono::seconds(3);
constexpr auto kHostedGrace = std::chrono::seconds(30);
constexpr auto kLoopPeriod = std::chrono::milliseconds(2);

// Whether `peers` shows this node's link to DOMAIN/NODE up.
bool link_up(const federation::PeersReport& peers, const std::string& domain, const std::string& node) {
  for (const auto& p : peers.peers)
    if (p.link.identity.domain == domain && p.link.identity.node == node && p.link.state == "up") return true;
  return false;
}

std::string grant_key(const std::string& domain, const std::string& stream) {
  return "hosted-reads/" + domain + "/" + stream;
}

// Sets (or with a null `hosted`, removes) the fragment's "hosted" member in
// the query's entry.
bool mark_hosted(cluster::Catalog& catalog, const std::string& query, const std::string& fragment,
                 const std::string& hosted_json, int64_t wait_ms) {
  return edit_query_entry(catalog, query, [&](rapidjson::Document& d) {
    if (!d.HasMember("fragments") || !d["fragments"].IsArray()) return false;
    for (auto& f : d["fragments"].GetArray()) {
      if (!f.IsObject() || !f.HasMember("name") || !f["name"].IsString() || f["name"].GetString() != fragment)
        continue;
      f.RemoveMember("hosted");
      if (!hosted_json.empty()) {
        rapidjson::Document h;
        h.Parse(hosted_json.data(), hosted_json.size());
        rapidjson::Value v;
        v.CopyFrom(h, d.GetAllocator());
        f.AddMember("hosted", v, d.GetAllocator());
      }
      return true;
    }
    return false;
  }, wait_ms);
}

}  // namespace

// ------------------------------------------------------------ owner side

void NodeImpl::post_hosted(std::function<void()> job) {
  std::lock_guard lock(hosted_mu_);
  if (hosted_stopping_) return;
  hosted_jobs_.push_back(std::move(job));
  if (!hosted_thread_.joinable()) hosted_thread_ = std::thread([this] { hosted_loop(); });
  hosted_cv_.notify_all();
}

void NodeImpl::start_hosted_move(const std::string& query, const std::string& fragment,
                                 const std::string& host_domain, const std::string& host_node,
                                 const std::string& contract, uint64_t price, uint64_t load, bool warm,
                                 http::Respond answer) {
  {
    std::lock_guard lock(hosted_mu_);
    if (hosted_stopping_) {
      answer(http::Response::problem(503, "Service Unavailable", config_.node + " is stopping; nothing moved"));
      return;
    }
  }
  post_hosted(
      [=, this] { answer(run_hosted_move(query, fragment, host_domain, host_node, contract, price, load, warm)); });
}

Status NodeImpl::grant_hosted_reads(const std::string& host_domain, const std::vector<std::string>& streams,
                                    const std::string& query, const std::string& fragment,
                                    const std::string& contract) {
  JsonOut gj;
  gj.begin_object().key("query").str(query).key("fragment").str(fragment).key("contract").str(contract);
  const std::string grant = gj.end_object().take();
  int64_t last = 0;
  for (const auto& g : streams) {
    auto rev = catalog_->create(grant_key(host_domain, g), grant);
    if (!rev.ok() && rev.error().code != Errc::already_exists)
      return make_error(rev.error().code, "granting " + host_domain + " reads of " + g + ": " + rev.error().message);
    if (rev.ok()) last = std::max(last, *rev);
  }
  // Every node of the domain knows of the grants before the host asks.
  if (last != 0) catalog_->wait_for(last, config_.cluster.etcd_timeout_ms);
  return Status::Ok();
}

Status NodeImpl::send_hosted_state(federation::Hosting& hosting, const certs::Identity& host,
                                   const std::string& query, const std::string& fragment,
                                   const std::string& snapshot) {
  const size_t chunks = (snapshot.size() + kChunkBytes - 1) / kChunkBytes;
  for (size_t i = 0; i < chunks; ++i) {
    JsonOut c;
    c.begin_object().key("query").str(query).key("fragment").str(fragment);
    c.key("index").u64(i).key("count").u64(chunks);
    c.key("data").str(hex_of(std::string_view(snapshot).substr(i * kChunkBytes, kChunkBytes)));
    auto sent = call_host(hosting, host, "hosting.chunk", members_of(c.end_object().take()), kCallWait);
    if (!sent.ok()) return sent.error();
  }
  return Status::Ok();
}

std::string NodeImpl::open_hosted_relays(const std::vector<std::pair<std::string, std::string>>& relays,
                                         const std::string& where) {
  struct Join {
    std::mutex mu;
    size_t left;
    std::string error;
    std::promise<void> done;
  };
  auto join = std::make_shared<Join>();
  join->left = relays.size();
  auto done = join->done.get_future();
  for (const auto& [mirror, target] : relays) {
    StreamPtr t = find_stream(target);
    if (!t) return "stream " + target + " is not on " + config_.node + " any more";
    peering_->create_import(mirror, t->meta().schema, [join, mirror](Result<federation::ImportInfo> r) {
      std::lock_guard lock(join->mu);
      if (!r.ok() && r.error().code != Errc::already_exists && join->error.empty())
        join->error = "reading " + mirror + ": " + r.error().message;
      if (--join->left == 0) join->done.set_value();
    });
  }
  const bool all = done.wait_for(kCallWait / 2) == std::future_status::ready;
  std::lock_guard lock(join->mu);
  if (!all && join->error.empty()) return "the reads of " + where + "'s streams did not open within 15 s";
  return join->error;
}

http::Response NodeImpl::run_hosted_move(const std::string& query, const std::string& fragment,
                                         const std::string& host_domain, const std::string& host_node,
                                         const std::string& contract, uint64_t price, uint64_t load,
                                         bool warm) {
  const auto t0 = Clock::now();
  const std::string runner = engine::fragment_network_name(query, fragment);
  const std::string where = host_domain + "/" + host_node;
  const std::string what = "moving fragment " + fragment + " of query '" + query + "' to " + where;
  const int64_t etcd_ms = config_.cluster.etcd_timeout_ms;
  auto failed = [&](int status, const std::string& why) {
    log_line(LogLevel::info, "hosting", what + ": " + why);
    return http::Response::problem(status, status == 503 ? "Service Unavailable" : "Conflict", why);
  };
  federation::Hosting* hosting = peering_ ? peering_->hosting() : nullptr;
  if (!hosting || !catalog_) return failed(503, "the federation or the domain's catalog is not started; nothing moved");
  auto q = find_query(runner);
  if (!q) return failed(409, "fragment " + fragment + " does not run on " + config_.node + " now; nothing moved");
  if (fragment_is_hosted(runner)) return failed(409, "fragment " + fragment + " is hosted already; nothing moved");
  const QueryMeta meta = q->meta();
  const std::string body = fragment_body_of(meta);
  if (body.empty() || meta.state_stream.empty())
    return failed(409, "the query's catalog entry has no body for fragment " + fragment + "; nothing moved");
  // The streams of this domain the host reads: the fragment's inputs.
  std::vector<std::string> grants;
  for (const auto& in : meta.inputs) {
    std::string name = in;
    if (name.starts_with("@")) name = name.substr(name.find('/') + 1);
    if (name.find('/') != std::string::npos)
      return failed(409, "fragment " + fragment + " reads " + in + ", a stream of another domain: a hosted "
                         "fragment reads streams of its owner's domain only; nothing moved");
    grants.push_back(name);
  }
  // And its state stream, for a standby there (cluster_hosted_warm.cpp).
  grants.push_back(meta.state_stream);
  auto revoke = [&] {
    for (const auto& g : grants) (void)catalog_->erase(grant_key(host_domain, g));
  };
  if (Status st = grant_hosted_reads(host_domain, grants, query, fragment, contract); !st.ok()) {
    revoke();
    return failed(503, st.error().message + "; nothing moved");
  }
  const certs::Identity host{host_domain, host_node};
  // An earlier run of it there ends first: one this domain took back while
  // the link was down, which the host keeps until its grace ends (the
  // fragment runs here, so no run there is this domain's).
  (void)end_host_run(*hosting, host, query, fragment, true);
  // 0. A standby there, caught up while the fragment still runs here: the
  //    state goes before the pause. Without one, it goes in the pause.
  if (const std::string why = warm ? warm_on_host(*hosting, host, contract, body, load, q) : "";
      warm && !why.empty()) {
    // With no link to the host, sending the state would fail too: the
    // fragment is not stopped for nothing.
    if (!link_up(peering_->peers_report(), host_domain, host_node)) {
      revoke();
      return failed(503, "no standby on " + where + " (" + why + ") and no link up to it; nothing moved");
    }
    log_line(LogLevel::info, "hosting", what + ": no standby there (" + why + "); the state goes in the pause");
    (void)end_host_run(*hosting, host, query, fragment, true);
    warm = false;
  }
  JsonOut mark;
  mark.begin_object().key("domain").str(host_domain).key("node").str(host_node).key("contract").str(contract);
  mark.key("state").str("starting").end_object();
  if (!mark_hosted(*catalog_, query, fragment, mark.take(), etcd_ms)) {
    revoke();
    return failed(503, "the query's catalog entry could not be updated; nothing moved");
  }
  // 1. The fragment stops here, where it stands.
  if (Status st = detach_query(runner); !st.ok()) {
    (void)mark_hosted(*catalog_, query, fragment, "", etcd_ms);
    revoke();
    return failed(503, "stopping the fragment: " + st.error().message + "; nothing moved");
  }
  const auto t_stop = Clock::now();
  auto rollback = [&](int status, const std::string& why) {
    if (warm) (void)end_host_run(*hosting, host, query, fragment, true);  // its standby
    rerun_fragment(meta, body);
    (void)mark_hosted(*catalog_, query, fragment, "", etcd_ms);
    revoke();
    return failed(status, why + "; the fragment runs on " + config_.node + " again");
  };
  // (Warm: no snapshot; the standby there holds the state.)
  auto state = q->stopped_state(!warm);
  if (!state.ok()) return rollback(409, "the fragment's state: " + state.error().message);
  // The state stream's appends land before the host continues it.
  const StreamPtr state_log = q->state_stream();
  for (int i = 0; i < 500 && state_log->committed_next() != state_log->next_seq(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const uint64_t state_next = state_log->next_seq();
  const auto t_state = Clock::now();
  // 2. The run: warm, or with the state, in pieces, first.
  auto ran = call_hosted_run(*hosting, host, meta, contract, body, *state, state_next, load, warm);
  if (!ran.ok() && warm) {
    // The standby did not take over (the host dropped it): the state goes
    // now, in the pause.
    log_line(LogLevel::warn, "hosting", what + ": the standby there did not take over (" + ran.error().message + "); the state goes now");
    warm = false;
    state = q->stopped_state(true);
    if (!state.ok()) return rollback(409, "the fragment's state: " + state.error().message);
    ran = call_hosted_run(*hosting, host, meta, contract, body, *state, state_next, load, warm);
  }
  if (!ran.ok()) {
    const int status = ran.error().code == Errc::conflict ? 409 : 503;
    return rollback(status, where + " did not run it: " + ran.error().message);
  }
  const auto t_run = Clock::now();
  rapidjson::Document a;
  a.Parse(ran->data(), ran->size());
  std::vector<std::string> hidden;
  if (a.IsObject() && a.HasMember("outputs") && a["outputs"].IsArray())
    for (const auto& o : a["outputs"].GetArray())
      if (o.IsString()) hidden.emplace_back(o.GetString());
  const std::string hidden_state = a.IsObject() ? str_of(a, "state") : "";
  auto end_there = [&] { (void)end_host_run(*hosting, host, query, fragment, true); };
  if (hidden.size() != meta.outputs.size() || hidden_state.empty()) {
    end_there();
    return rollback(503, where + " answered without the streams it writes");
  }
  // 3. Its results come back: the relay appends them here.
  HostedRun h;
  h.query = query;
  h.fragment = fragment;
  h.runner = runner;
  h.host_domain = host_domain;
  h.host_node = host_node;
  h.contract = contract;
  h.body = body;
  h.meta = meta;
  h.grants = grants;
  h.price = price;
  h.load = load;
  h.since_ms = wall_clock_ms();
  h.pause_ms = ms_between(t_stop, t_run);
  // Where the pause went: the stop here, then the call (the host's part of
  // it as it measured it, and of that, its standby catching up).
  JsonOut steps;
  steps.begin_object().key("stop").dbl(ms_between(t_stop, t_state)).key("run_call").dbl(ms_between(t_state, t_run));
  if (a.IsObject() && a.HasMember("took_ms") && a["took_ms"].IsNumber())
    steps.key("host").dbl(a["took_ms"].GetDouble());
  if (a.IsObject() && a.HasMember("catch_up_ms") && a["catch_up_ms"].IsNumber())
    steps.key("host_catch_up").dbl(a["catch_up_ms"].GetDouble());
  const std::string steps_json = steps.end_object().take();
  for (size_t o = 0; o < hidden.size(); ++o) h.relays.emplace_back(host_domain + "/" + hidden[o], meta.outputs[o]);
  h.relays.emplace_back(host_domain + "/" + hidden_state, meta.state_stream);
  const std::string error = open_hosted_relays(h.relays, where);
  if (!error.empty()) {
    for (const auto& [mirror, _] : h.relays) (void)delete_import(mirror);
    end_there();
    return rollback(503, error);
  }
  {
    std::lock_guard lock(hosted_mu_);
    hosted_[runner] = h;
  }
  JsonOut m2;
  m2.begin_object().key("domain").str(host_domain).key("node").str(host_node).key("contract").str(contract);
  m2.key("state").str("running").key("since_ms").i64(h.since_ms).key("pause_ms").dbl(h.pause_ms).end_object();
  (void)mark_hosted(*catalog_, query, fragment, m2.take(), etcd_ms);
  metrics_
      .counter("entente_fragment_hosted_moves_total", "Fragments moved to a node of another domain (hosted runs)",
               {{"direction", "out"}})
      .inc();
  log_line(LogLevel::info, "hosting", what + ": done, paused " + std::to_string(static_cast<int64_t>(h.pause_ms)) + " ms, under contract " +
           contract);
  JsonOut j;
  j.begin_object().key("query").str(query).key("fragment").str(fragment).key("state").str("hosted");
  j.key("from").str(config_.node).key("to").str(where).key("contract").str(contract);
  uint64_t state_bytes = state->snapshot.size();
  if (warm)
    for (const auto& box : q->info().boxes) state_bytes += box.stats.state_bytes;
  j.key("warm").boolean(warm).key("state_bytes").u64(state_bytes);
  j.key("pause_ms").dbl(h.pause_ms).key("steps_ms").raw(steps_json).key("total_ms").dbl(ms_between(t0, Clock::now()));
  j.end_object();
  return http::Response::json(200, j.take());
}

Result<std::string> NodeImpl::call_hosted_run(federation::Hosting& hosting, const certs::Identity& host,
                                             const QueryMeta& meta, const std::string& contract,
                                             const std::string& body, const QueryRunner::State& state,
                                             uint64_t state_next, uint64_t load, bool warm) {
  size_t chunks = 0;
  if (!warm) {
    if (state.snapshot.size() > kMaxHostedSnapshot)
      return make_error(Errc::conflict, "the fragment's state is " + std::to_string(state.snapshot.size() >> 20) +
                                            " MiB, over the " + std::to_string(kMaxHostedSnapshot >> 20) +
                                            " MiB a hosted run is sent");
    chunks = (state.snapshot.size() + kChunkBytes - 1) / kChunkBytes;
    if (Status st = send_hosted_state(hosting, host, meta.query, meta.fragment, state.snapshot); !st.ok())
      return make_error(Errc::unavailable, "sending the fragment's state: " + st.error().message);
  }
  JsonOut r;
  r.begin_object().key("query").str(meta.query).key("fragment").str(meta.fragment).key("contract").str(contract);
  r.key("body").raw(body);
  r.key("positions").begin_array();
  for (auto p : state.positions) r.u64(p);
  r.end_array().key("out_next").begin_array();
  for (auto n : state.out_next) r.u64(n);
  r.end_array();
  r.key("state_next").u64(state_next).key("journal_next").u64(state.journal_next);
  r.key("next_checkpoint_id").u64(state.next_checkpoint_id).key("chunks").u64(chunks);
  r.key("load").u64(load).key("warm").boolean(warm);
  return call_host(hosting, host, "hosting.run", members_of(r.end_object().take()), kCallWait);
}

uint64_t NodeImpl::hosted_load_on(const std::string& domain) {
  std::lock_guard lock(hosted_mu_);
  uint64_t sum = 0;
  for (const auto& [_, h] : hosted_)
    if (h.host_domain == domain) sum += h.load;
  return sum;
}

bool NodeImpl::fragment_hosted_in_entry(const std::string& entry_json, const std::string& fragment) {
  rapidjson::Document d;
  d.Parse(entry_json.data(), entry_json.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("fragments") || !d["fragments"].IsArray()) return false;
  for (const auto& f : d["fragments"].GetArray())
    if (f.IsObject() && f.HasMember("name") && f["name"].IsString() && f["name"].GetString() == fragment)
      return f.HasMember("hosted");
  return false;
}

bool NodeImpl::fragment_is_hosted(const std::string& runner) {
  std::lock_guard lock(hosted_mu_);
  return hosted_.count(runner) != 0;
}

std::optional<std::string> NodeImpl::hosted_fragment_json(const std::string& runner) {
  std::lock_guard lock(hosted_mu_);
  auto it = hosted_.find(runner);
  if (it == hosted_.end()) return std::nullopt;
  const HostedRun& h = it->second;
  JsonOut j;
  j.begin_object().key("state").str(h.ending ? "taking_back" : "running");
  j.key("hosted").begin_object().key("domain").str(h.host_domain).key("node").str(h.host_node);
  j.key("contract").str(h.contract).key("since_ms").i64(h.since_ms).key("pause_ms").dbl(h.pause_ms);
  j.key("load_seconds").dbl(h.cpu_seconds).key("cost").dbl(h.cost).key("price").u64(h.price);
  j.key("relays").begin_array();
  for (const auto& [mirror, target] : h.relays) {
    StreamPtr m = find_stream(mirror), t = find_stream(target);
    j.begin_object().key("from").str(mirror).key("to").str(target);
    j.key("received_next").u64(m ? m->committed_next() : 0).key("appended_next").u64(t ? t->next_seq() : 0);
    j.end_object();
  }
  j.end_array().end_object().end_object();
  return j.take();
}

void NodeImpl::relay_hosted() {
  std::vector<std::pair<std::string, std::string>> relays;
  {
    std::lock_guard lock(hosted_mu_);
    for (const auto& [_, h] : hosted_) relays.insert(relays.end(), h.relays.begin(), h.relays.end());
  }
  for (const auto& [mirror, target] : relays) {
    StreamPtr m = find_stream(mirror), t = find_stream(target);
    if (!m || !t) continue;
    uint64_t from = t->next_seq();
    if (from >= m->committed_next()) continue;
    std::vector<store::LogRecord> recs;
    if (Status st = store::StreamLog::read(*store_, m->meta().id, from, 64, 8u << 20, recs); !st.ok()) {
      log_line(LogLevel::warn, "hosting", "relaying " + mirror + " to " + target + ": " + st.error().message);
      continue;
    }
    for (const auto& rec : recs) {
      if (rec.last < from) continue;
      if (rec.first > from) {
        // The copy starts after what the stream needs: never filled.
        log_line(LogLevel::info, "hosting", "relaying " + mirror + " to " + target + ": the copy holds " + std::to_string(rec.first) +
                 " onwards, the stream needs " + std::to_string(from));
        break;
      }
      std::string_view bytes = rec.payload;
      auto b = engine::decode_batch(bytes);
      if (!b.ok()) {
        log_line(LogLevel::warn, "hosting", "relaying " + mirror + ": " + b.error().message);
        break;
      }
      engine::Batch batch = std::move(*b);
      if (rec.first < from) {
        std::vector<uint32_t> rows(rec.last - from + 1);
        for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<uint32_t>(from - rec.first + i);
        batch = batch.take(rows);
      }
      const uint64_t n = batch.rows();
      if (Status st = t->append_at(from, std::move(batch), *gc_, store::Admission::wait, nullptr); !st.ok()) {
        log_line(LogLevel::warn, "hosting", "relaying " + mirror + " to " + target + ": " + st.error().message);
        break;
      }
      from += n;
    }
  }
}

http::Response NodeImpl::take_back(const std::string& runner, const std::string& why) {
  const auto t0 = Clock::now();
  HostedRun h;
  {
    std::lock_guard lock(hosted_mu_);
    auto it = hosted_.find(runner);
    if (it == hosted_.end())
      return http::Response::problem(409, "Conflict", "fragment " + runner + " is not hosted elsewhere");
    if (it->second.ending) return http::Response::problem(409, "Conflict", "fragment " + runner + " is being taken back");
    it->second.ending = true;
    h = it->second;
  }
  const std::string what = "taking fragment " + h.fragment + " of query '" + h.query + "' back from " +
                           h.host_domain + "/" + h.host_node;
  log_line(LogLevel::info, "hosting", what + ": " + why);
  const certs::Identity host{h.host_domain, h.host_node};
  federation::Hosting* hosting = peering_ ? peering_->hosting() : nullptr;
  // 4. The host's run stops; where its streams end.
  std::map<std::string, uint64_t> heads;  // mirror -> the host's stream's next
  if (hosting) {
    auto ended = end_host_run(*hosting, host, h.query, h.fragment, false);
    if (ended.ok()) {
      rapidjson::Document d;
      d.Parse(ended->data(), ended->size());
      const std::vector<uint64_t> next = d.IsObject() ? u64s(d, "next") : std::vector<uint64_t>{};
      for (size_t i = 0; i < next.size() && i < h.relays.size(); ++i) heads[h.relays[i].first] = next[i];
    } else {
      log_line(LogLevel::warn, "hosting", what + ": the host did not stop its run (" + ended.error().message +
               "): what its copies hold here is all that counts");
    }
  }
  // Everything the copies get, appended.
  auto drained = [&] {
    for (const auto& [mirror, target] : h.relays) {
      StreamPtr m = find_stream(mirror), t = find_stream(target);
      if (!m || !t) continue;
      // Where the host's stream ends, when it said: appended up to there.
      // (Its copy here may hold nothing at all: a stream the host never
      // wrote to starts where this one ends.)
      auto head = heads.find(mirror);
      if (head != heads.end()) {
        if (t->next_seq() < head->second) return false;
        continue;
      }
      if (t->next_seq() < m->committed_next()) return false;
    }
    return true;
  };
  for (const auto until = Clock::now() + kDrainWait; !drained() && Clock::now() < until;) {
    relay_hosted();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  relay_hosted();
  if (!drained()) log_line(LogLevel::warn, "hosting", what + ": the host's streams did not all arrive within 10 s; what arrived counts");
  // The appends land before the recovery reads the state stream.
  for (const auto& [_, target] : h.relays) {
    StreamPtr t = find_stream(target);
    for (int i = 0; t && i < 1000 && t->committed_next() != t->next_seq(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  {
    std::lock_guard lock(hosted_mu_);
    hosted_.erase(runner);
  }
  for (const auto& [mirror, _] : h.relays)
    if (Status st = delete_import(mirror); !st.ok() && st.error().code != Errc::not_found)
      log_line(LogLevel::warn, "hosting", what + ": closing " + mirror + ": " + st.error().message);
  if (hosting) (void)end_host_run(*hosting, host, h.query, h.fragment, true);
  for (const auto& g : h.grants) (void)catalog_->erase(grant_key(h.host_domain, g));
  {
    // This run of it, not run_placed_fragments's, once the mark is gone.
    std::lock_guard lock(takeover_mu_);
    rerunning_.insert(runner);
  }
  (void)mark_hosted(*catalog_, h.query, h.fragment, "", config_.cluster.etcd_timeout_ms);
  // The fragment runs here again, from its state stream (unless it does
  // already: a failover here took it over while this node was down).
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  if (find_query(runner)) {
    std::lock_guard lock(takeover_mu_);
    rerunning_.erase(runner);
    p->set_value(Status::Ok());
  } else {
    run_fragment(h.query, h.fragment, h.body, FragmentRun::takeover,
                 [this, p, runner](Result<std::shared_ptr<QueryRunner>> r, bool) {
                   {
                     std::lock_guard lock(takeover_mu_);
                     rerunning_.erase(runner);
                   }
                   p->set_value(r.ok() ? Status::Ok() : r.error());
                 });
  }
  Status ran = f.get();
  const double pause = ms_between(t0, Clock::now());
  metrics_
      .counter("entente_fragment_hosted_moves_total", "Fragments moved to a node of another domain (hosted runs)",
               {{"direction", "back"}})
      .inc();
  if (!ran.ok()) {
    // run_placed_fragments tries again at each tick.
    log_line(LogLevel::warn, "hosting", what + ": running it here failed (tried again): " + ran.error().message);
    return http::Response::problem(503, "Service Unavailable",
                                   "fragment " + h.fragment + " is back but does not run yet: " + ran.error().message);
  }
  log_line(LogLevel::info, "hosting", what + ": done in " + std::to_string(static_cast<int64_t>(pause)) + " ms");
  JsonOut j;
  j.begin_object().key("query").str(h.query).key("fragment").str(h.fragment).key("state").str("taken_back");
  j.key("from").str(h.host_domain + "/" + h.host_node).key("to").str(config_.node).key("why").str(why);
  j.key("load_seconds").dbl(h.cpu_seconds).key("cost").dbl(h.cost);
  j.key("pause_ms").dbl(pause).end_object();
  return http::Response::json(200, j.take());
}

void NodeImpl::take_back_after_restart(const std::string& query, const std::string& fragment,
                                       const std::string& body_json, const std::string& hosted_json) {
  const std::string runner = engine::fragment_network_name(query, fragment);
  {
    std::lock_guard lock(hosted_mu_);
    if (hosted_.count(runner) || !taking_back_.insert(runner).second) return;
  }
  post_hosted([this, query, fragment, body_json, hosted_json, runner] {
    // Still marked, and still without a run here? (A move out of this
    // node, on this thread before this job, may have ended either way.)
    auto entry = cut_entry(query, true);
    bool still = entry && fragment_hosted_in_entry(entry->json, fragment);
    {
      std::lock_guard lock(hosted_mu_);
      still = still && !hosted_.count(runner);
      if (!still) {
        taking_back_.erase(runner);
        return;
      }
    }
    // What this node knew of the run before it restarted, from the entry:
    // the host, the contract, and the names the host gave its streams
    // (hidden_name: derived from this domain and the runner).
    rapidjson::Document m, b;
    m.Parse(hosted_json.data(), hosted_json.size());
    b.Parse(body_json.data(), body_json.size());
    Diagnostics diag;
    auto net = b.IsObject() && b.HasMember("network") && b["network"].IsObject()
                   ? engine::QueryNetwork::parse(json_text(b["network"]), diag)
                   : Result<engine::QueryNetwork>(make_error(Errc::invalid_argument, "no network"));
    if (!m.IsObject() || !net.ok()) {
      log_line(LogLevel::warn, "hosting", "fragment " + runner + " was hosted when this node stopped, but its entry cannot be read");
      std::lock_guard lock(hosted_mu_);
      taking_back_.erase(runner);
      return;
    }
    HostedRun h;
    h.query = query;
    h.fragment = fragment;
    h.runner = runner;
    h.host_domain = str_of(m, "domain");
    h.host_node = str_of(m, "node");
    h.contract = str_of(m, "contract");
    h.body = body_json;
    const std::string key = config_.domain + "/" + runner;
    for (size_t o = 0; o < net->outputs().size(); ++o)
      h.relays.emplace_back(h.host_domain + "/" + hidden_name(key, "o" + std::to_string(o)), net->outputs()[o].name);
    h.relays.emplace_back(h.host_domain + "/" + hidden_name(key, "state"), state_stream_name(runner));
    std::set<std::string> reads;
    if (b.HasMember("reads") && b["reads"].IsArray())
      for (const auto& r : b["reads"].GetArray())
        if (r.IsObject() && r.HasMember("stream") && r["stream"].IsString()) reads.insert(r["stream"].GetString());
    for (const auto& in : net->inputs())
      h.grants.push_back(reads.count(in.name) || in.stream.empty() ? in.name : in.stream);
    {
      std::lock_guard lock(hosted_mu_);
      hosted_[runner] = h;
      taking_back_.erase(runner);
    }
    (void)take_back(runner, "this node restarted while the fragment was hosted");
  });
}

void NodeImpl::check_hosted() {
  std::vector<std::pair<std::string, std::string>> back;  // runner, why
  const contracts::Ledger* ledger =
      peering_ && peering_->contracting() ? &peering_->contracting()->ledger() : nullptr;
  const auto peers = peering_ ? peering_->peers_report() : federation::PeersReport{};
  const int64_t now = wall_clock_ms();
  {
    std::lock_guard lock(hosted_mu_);
    for (auto& [runner, h] : hosted_) {
      if (h.ending) continue;
      if (ledger) {
        auto c = ledger->get(h.contract);
        if (!c.ok() || !c->in_force(now)) {
          // Under notice the host keeps it until the notice ends; the owner
          // takes it back at once all the same.
          back.emplace_back(runner, "contract " + h.contract + " is no longer in force" +
                                        (c.ok() && c->in_notice(now)
                                             ? " (revoked with notice until " +
                                                   contracts::format_time(c->notice_until_ms()) + ")"
                                             : std::string()));
          continue;
        }
        // Hosting above the contract's maximum load, three checks in a row
        // (what the host measures, with the other runs under it).
        const uint64_t max = c->current().terms.hosting.max_load;
        double sum = 0;
        for (const auto& [_, o] : hosted_)
          if (o.contract == h.contract) sum += o.cpu_ms_per_s;
        h.over_load = sum > static_cast<double>(max) ? h.over_load + 1 : 0;
        if (h.over_load >= 3) {
          back.emplace_back(runner, "its load on the host, " + std::to_string(static_cast<int64_t>(sum)) +
                                        " CPU ms/s with the others under the contract, exceeds contract " +
                                        h.contract + "'s maximum " + std::to_string(max) + " CPU ms/s");
          continue;
        }
      }
      if (link_up(peers, h.host_domain, h.host_node)) {
        h.link_down_since = {};
      } else if (h.link_down_since == Clock::time_point{}) {
        h.link_down_since = Clock::now();
      } else if (Clock::now() - h.link_down_since > kHostLost) {
        back.emplace_back(runner, "the link to " + h.host_domain + "/" + h.host_node + " is down for " +
                                      std::to_string(std::chrono::seconds(kHostLost).count()) + " s");
      }
    }
  }
  for (const auto& [runner, why] : back) (void)take_back(runner, why);
}

// ------------------------------------------------------------- host side

bool NodeImpl::hosted_mirror_wanted(const std::string& name) {
  std::lock_guard lock(hosted_mu_);
  return hosted_mirrors_wanted_.count(name) != 0;
}

Result<StreamPtr> NodeImpl::create_hidden_stream(StreamMeta meta, uint64_t first) {
  {
    auto id = allocate_id_durably();
    if (!id.ok()) return id.error();
    meta.id.value = *id;
  }
  meta.created_ms = wall_clock_ms();
  auto s = std::make_shared<Stream>(std::move(meta), first);
  std::lock_guard lock(hosted_mu_);
  if (hosted_streams_.count(s->meta().name))
    return make_error(Errc::already_exists, "hidden stream '" + s->meta().name + "' exists");
  hosted_streams_[s->meta().name] = s;
  return s;
}

bool NodeImpl::hosted_hidden(const std::string& name) {
  std::lock_guard lock(hosted_mu_);
  return hosted_streams_.count(name) != 0 || hosted_mirrors_wanted_.count(name) != 0;
}

StreamPtr NodeImpl::find_hosted_stream(const std::string& name) {
  std::lock_guard lock(hosted_mu_);
  auto it = hosted_streams_.find(name);
  return it == hosted_streams_.end() ? nullptr : it->second;
}

bool NodeImpl::may_read_hosted(const std::string& stream, const std::string& domain) {
  {
    std::lock_guard lock(hosted_mu_);
    for (const auto& [_, r] : hosting_here_)
      if (r.owner_domain == domain && std::find(r.streams.begin(), r.streams.end(), stream) != r.streams.end())
        return true;
  }
  // The owner's side: a grant of the domain's catalog, under a contract in
  // force.
  if (!catalog_) return false;
  auto e = catalog_->get(grant_key(domain, stream));
  if (!e) return false;
  rapidjson::Document d;
  d.Parse(e->value.data(), e->value.size());
  const contracts::Ledger* ledger =
      peering_ && peering_->contracting() ? &peering_->contracting()->ledger() : nullptr;
  if (!d.IsObject() || !ledger) return false;
  // (Under a revocation's notice too: the run goes on until it ends.)
  auto c = ledger->get(str_of(d, "contract"));
  const int64_t now = wall_clock_ms();
  return c.ok() && (c->in_force(now) || c->in_notice(now));
}

void NodeImpl::on_hosted_ack(const std::string& stream, const std::string& domain, uint64_t through) {
  std::vector<std::function<void(const Status&)>> released;
  {
    std::lock_guard lock(hosted_mu_);
    for (auto it = ack_waits_.begin(); it != ack_waits_.end();) {
      if (it->stream == stream && it->domain == domain && it->last <= through) {
        released.push_back(std::move(it->release));
        it = ack_waits_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& r : released) r(Status::Ok());
}

void NodeImpl::on_hosting(const certs::Identity& peer, const std::string& type, const std::string& message,
                          std::function<void(bool, const std::string&, const std::string&)> answer) {
  rapidjson::Document d;
  d.Parse(message.data(), message.size());
  if (d.HasParseError() || !d.IsObject()) {
    if (answer) answer(false, "not a JSON object", "");
    return;
  }
  const std::string query = str_of(d, "query"), fragment = str_of(d, "fragment");
  const std::string runner = engine::fragment_network_name(query, fragment);
  const std::string key = peer.domain + "/" + runner;
  if (type == "hosting.usage") {
    // Owner side: the host's measure of the run's CPU time.
    std::lock_guard lock(hosted_mu_);
    auto it = hosted_.find(runner);
    if (it == hosted_.end() || it->second.host_domain != peer.domain) return;
    HostedRun& h = it->second;
    if (d.HasMember("cpu_ms_per_s") && d["cpu_ms_per_s"].IsNumber())
      h.cpu_ms_per_s = std::clamp(d["cpu_ms_per_s"].GetDouble(), 0.0, 1e6);
    if (!d.HasMember("cpu_seconds") || !d["cpu_seconds"].IsNumber()) return;
    const double cpu = std::clamp(d["cpu_seconds"].GetDouble(), 0.0, 1e12);
    if (cpu <= h.cpu_seconds) return;
    // This domain's ledger counts the CPU time the host reports.
    if (peering_ && peering_->contracting())
      (void)peering_->contracting()->ledger().add_load(h.contract, static_cast<uint64_t>((cpu - h.cpu_seconds) * 1e6));
    h.cpu_seconds = cpu;
    h.cost = h.cpu_seconds * static_cast<double>(h.price);
    return;
  }
  if (!answer) return;
  if (query.empty() || fragment.empty() || query.size() > 100 || fragment.size() > 64) {
    answer(false, "'query' and 'fragment' are required (at most 100 and 64 bytes)", "");
    return;
  }
  if (type == "hosting.chunk") {
    const uint64_t index = u64_of(d, "index"), count = u64_of(d, "count");
    auto bytes = bytes_of_hex(str_of(d, "data"));
    if (!bytes || count == 0 || index >= count || count > kMaxHostedSnapshot / kChunkBytes + 1) {
      answer(false, "a malformed chunk of state", "");
      return;
    }
    std::lock_guard lock(hosted_mu_);
    if (index == 0) {
      if (hosted_chunks_.size() >= kMaxHostedHere && !hosted_chunks_.count(key)) {
        answer(false, "too many states arriving at once; retry later", "");
        return;
      }
      hosted_chunks_[key].clear();
    }
    auto it = hosted_chunks_.find(key);
    if (it == hosted_chunks_.end()) {
      answer(false, "chunk " + std::to_string(index) + " of a state whose first chunk did not arrive", "");
      return;
    }
    // Bounded in all: states arriving for runs that never come hold memory.
    size_t buffered = 0;
    for (const auto& [_, b] : hosted_chunks_) buffered += b.size();
    if (buffered + bytes->size() > kMaxHostedChunkBytes || it->second.size() + bytes->size() > kMaxHostedSnapshot) {
      hosted_chunks_.erase(it);
      answer(false, "more state arriving than " + config_.node + " holds at once (" +
                        std::to_string(kMaxHostedChunkBytes >> 20) + " MiB); retry later", "");
      return;
    }
    it->second += *bytes;
    answer(true, "", "");
    return;
  }
  if (type == "hosting.warm") {
    serve_hosted_warm(peer, message, answer);
    return;
  }
  if (type == "hosting.run") {
    post_hosted([this, peer, message, answer] { serve_hosted_run(peer, message, answer); });
    return;
  }
  if (type == "hosting.end") {
    const bool release = d.HasMember("release") && d["release"].IsBool() && d["release"].GetBool();
    post_hosted([this, key, release, answer] {
      std::vector<uint64_t> next;
      {
        std::lock_guard lock(hosted_mu_);
        auto it = hosting_here_.find(key);
        if (it == hosting_here_.end()) {
          answer(!release ? false : true, release ? "" : "no such hosted run here", "");
          return;
        }
      }
      end_hosted_here(key, release);
      {
        std::lock_guard lock(hosted_mu_);
        auto it = hosting_here_.find(key);
        if (it != hosting_here_.end())
          for (const auto& s : it->second.streams) {
            auto hs = hosted_streams_.find(s);
            next.push_back(hs == hosted_streams_.end() ? 0 : hs->second->committed_next());
          }
      }
      JsonOut j;
      j.begin_object().key("next").begin_array();
      for (auto n : next) j.u64(n);
      j.end_array().end_object();
      answer(true, "", j.take());
    });
    return;
  }
  answer(false, "unknown call " + type, "");
}

std::string NodeImpl::open_hosted_copies(const std::string& key, const std::string& owner_domain,
                                         const std::vector<std::pair<std::string, engine::SchemaPtr>>& copies,
                                         const std::vector<uint64_t>& from) {
  if (copies.empty()) return {};
  {
    std::lock_guard lock(hosted_mu_);
    auto& here = hosting_here_[key];
    for (const auto& [m, _] : copies) {
      hosted_mirrors_wanted_.insert(m);
      here.mirrors.push_back(m);
    }
  }
  auto p = std::make_shared<std::promise<std::string>>();
  auto f = p->get_future();
  struct Join {
    std::mutex mu;
    size_t left;
    std::string error;
  };
  auto join = std::make_shared<Join>();
  join->left = copies.size();
  // Each from where the run reads it (its checkpoint's positions): what
  // comes before is the owner's alone.
  for (size_t i = 0; i < copies.size(); ++i) {
    const auto& [mirror, schema] = copies[i];
    peering_->create_import(
        mirror, schema,
        [join, p, mirror](Result<federation::ImportInfo> r) {
          std::lock_guard lock(join->mu);
          if (!r.ok() && join->error.empty()) join->error = "reading " + mirror + ": " + r.error().message;
          if (--join->left == 0) p->set_value(join->error);
        },
        std::chrono::seconds(10), i < from.size() ? from[i] : 0);
  }
  std::string error = f.wait_for(kCallWait / 2) == std::future_status::ready
                          ? f.get()
                          : "the copies of " + owner_domain + "'s streams did not open within 15 s";
  std::lock_guard lock(hosted_mu_);
  for (const auto& [m, _] : copies) hosted_mirrors_wanted_.erase(m);
  return error;
}

void NodeImpl::serve_hosted_run(const certs::Identity& owner, const std::string& message,
                                std::function<void(bool, const std::string&, const std::string&)> answer) {
  const auto t_begin = Clock::now();
  rapidjson::Document d;
  d.Parse(message.data(), message.size());
  const std::string query = str_of(d, "query"), fragment = str_of(d, "fragment");
  const std::string runner = engine::fragment_network_name(query, fragment);
  const std::string key = owner.domain + "/" + runner;
  auto refuse = [&](const std::string& why) {
    log_line(LogLevel::warn, "hosting", "hosting fragment " + fragment + " of query '" + query + "' for " + owner.uri() + ": refused: " + why);
    answer(false, why, "");
  };
  // The host checks the contract again, with its own engine and ledger.
  federation::Hosting* hosting = peering_ ? peering_->hosting() : nullptr;
  if (!hosting) return refuse("the federation is not started here");
  auto def = read_definition(*hosting, owner.domain, d, query, fragment);
  if (!def.ok()) return refuse(def.error().message);
  const std::string& network_json = def->network_json;
  const engine::QueryNetwork* net = &*def->net;
  const std::set<std::string>& reads = def->reads;
  const std::set<std::string>& writes = def->writes;
  QueryRunner::State state;
  state.positions = u64s(d, "positions");
  state.out_next = u64s(d, "out_next");
  state.journal_next = u64_of(d, "journal_next");
  state.next_checkpoint_id = u64_of(d, "next_checkpoint_id");
  const uint64_t state_next = std::max<uint64_t>(1, u64_of(d, "state_next"));
  if (state.positions.size() != net->inputs().size() || state.out_next.size() != net->outputs().size())
    return refuse("'positions' and 'out_next' must hold one number per input and output of the network");
  // Warm: a standby built here before the pause (hosting.warm) takes over;
  // no state comes with the call.
  const bool warm = d.HasMember("warm") && d["warm"].IsBool() && d["warm"].GetBool();
  {
    std::lock_guard lock(hosted_mu_);
    auto here = hosting_here_.find(key);
    if (warm) {
      if (here == hosting_here_.end() || !here->second.standby)
        return refuse("no warm standby of the fragment here" +
                      (here != hosting_here_.end() && !here->second.standby_error.empty()
                           ? ": " + here->second.standby_error
                           : std::string()));
      if (here->second.runner) return refuse("this node hosts that fragment already");
      here->second.contract = def->contract;
    }
  }
  if (!warm) {
    std::lock_guard lock(hosted_mu_);
    if (hosting_here_.count(key)) return refuse("this node hosts that fragment already");
    if (hosting_here_.size() >= kMaxHostedHere)
      return refuse(config_.node + " hosts " + std::to_string(kMaxHostedHere) + " fragments already");
    if (u64_of(d, "chunks") > 0) {
      auto it = hosted_chunks_.find(key);
      if (it == hosted_chunks_.end()) return refuse("the fragment's state did not arrive");
      state.snapshot = std::move(it->second);
      hosted_chunks_.erase(it);
    }
    hosting_here_[key] = HostedHere{owner.domain, owner.node, def->contract, query, fragment, nullptr, {}, {}, {}};
  }
  auto forget = [&] {
    if (warm) {
      end_hosted_here(key, true);  // the standby, its copies and streams
      return;
    }
    std::vector<std::string> mirrors;
    {
      std::lock_guard lock(hosted_mu_);
      auto it = hosting_here_.find(key);
      if (it != hosting_here_.end()) {
        for (const auto& s : it->second.streams) hosted_streams_.erase(s);
        mirrors = it->second.mirrors;
        hosting_here_.erase(it);
      }
    }
    for (const auto& m : mirrors) (void)peering_->forget_import(m);
  };
  // The owner's streams it reads: hidden copies, from where the run reads
  // each (the positions the owner's state gives).
  QueryMeta meta;
  meta.name = runner;
  meta.query = query;
  meta.fragment = fragment;
  meta.network_json = network_json;
  meta.created_ms = wall_clock_ms();
  std::vector<StreamPtr> ins, outs;
  if (!warm) {
    std::vector<std::pair<std::string, engine::SchemaPtr>> copies;
    if (const std::string error = hosted_inputs(owner.domain, *net, reads, state.positions, meta, copies);
        !error.empty()) {
      forget();
      return refuse(error);
    }
    if (const std::string error = open_hosted_copies(key, owner.domain, copies, meta.start); !error.empty()) {
      forget();
      return refuse(error);
    }
    for (const auto& [mirror, _] : copies) {
      StreamPtr s = find_hosted_stream(mirror);
      if (!s) s = find_stream(mirror);  // this node imported it for itself already
      if (!s) {
        forget();
        return refuse("the copy of " + mirror + " is not here");
      }
      ins.push_back(s);
    }
  }
  // Its outputs and state stream: hidden, continuing the owner's numbers.
  StreamPtr state_log;
  if (const std::string error =
          create_hosted_streams(key, owner.domain, *net, writes, state.out_next, state_next, meta, outs, state_log);
      !error.empty()) {
    forget();
    return refuse(error);
  }
  double catch_up_ms = 0;
  if (warm) {
    const std::string error = promote_hosted_standby(key, state_next, state.journal_next, outs, meta.outputs,
                                                     state_log, meta.state_stream, catch_up_ms);
    if (!error.empty()) {
      forget();
      return refuse(error);
    }
  } else if (auto started = start_hosted_runner(key, owner.domain, meta, ins, outs, state_log, state);
             !started.ok()) {
    forget();
    return refuse(started.error().message);
  }
  metrics_
      .counter("entente_fragment_hosted_moves_total", "Fragments moved to a node of another domain (hosted runs)",
               {{"direction", "in"}})
      .inc();
  log_line(LogLevel::info, "hosting", "hosting fragment " + fragment + " of query '" + query + "' for " + owner.uri() + " under contract " +
           def->contract);
  JsonOut j;
  j.begin_object().key("outputs").begin_array();
  for (const auto& h : meta.outputs) j.str(h);
  j.end_array().key("state").str(meta.state_stream).key("contract").str(def->contract);
  j.key("took_ms").dbl(ms_between(t_begin, Clock::now()));
  if (warm) j.key("catch_up_ms").dbl(catch_up_ms);
  answer(true, "", j.end_object().take());
}

std::string NodeImpl::create_hosted_streams(const std::string& key, const std::string& owner_domain,
                                            const engine::QueryNetwork& net, const std::set<std::string>& writes,
                                            const std::vector<uint64_t>& out_next, uint64_t state_next,
                                            QueryMeta& meta, std::vector<StreamPtr>& outs, StreamPtr& state_log) {
  auto make = [&](const std::string& name, engine::SchemaPtr schema, uint64_t first) -> StreamPtr {
    StreamMeta sm;
    sm.name = name;
    sm.schema = std::move(schema);
    sm.producer = "hosted:" + owner_domain;
    auto s = create_hidden_stream(std::move(sm), first);
    if (!s.ok()) return nullptr;
    std::lock_guard lock(hosted_mu_);
    auto& here = hosting_here_[key];
    here.streams.push_back(name);
    here.first[name] = first;
    return *s;
  };
  for (size_t o = 0; o < net.outputs().size(); ++o) {
    const auto& out = net.outputs()[o];
    const bool internal = writes.count(out.name) != 0;
    if (internal) meta.internal_outputs.push_back(static_cast<uint32_t>(o));
    const std::string name = hidden_name(key, "o" + std::to_string(o));
    StreamPtr s = make(name, internal ? engine::internal_stream_schema(*out.schema) : out.schema, out_next.at(o));
    if (!s) return "creating the stream for output " + out.name + " failed";
    meta.outputs.push_back(name);
    outs.push_back(s);
  }
  meta.state_stream = hidden_name(key, "state");
  state_log = make(meta.state_stream, state_stream_schema(), state_next);
  if (!state_log) return "creating its state stream failed";
  return {};
}

Result<std::shared_ptr<QueryRunner>> NodeImpl::start_hosted_runner(
    const std::string& key, const std::string& owner_domain, const QueryMeta& meta, const std::vector<StreamPtr>& ins,
    const std::vector<StreamPtr>& outs, const StreamPtr& state_log, const QueryRunner::State& state) {
  auto created = QueryRunner::create(meta, ins, outs, hosted_env(key, owner_domain), state_log);
  if (!created.ok()) return make_error(created.error().code, "the fragment does not run here: " + created.error().message);
  std::shared_ptr<QueryRunner> run = *created;
  if (Status st = run->seed(state, true); !st.ok())
    return make_error(st.error().code, "the fragment's state does not restore here: " + st.error().message);
  {
    std::lock_guard lock(hosted_mu_);
    hosting_here_[key].runner = run;
  }
  run->start();
  // Its first checkpoint comes from the maintenance thread, at this node's
  // interval. Not asked for here: the request waits for the run's first
  // flush, which waits for the owner's acknowledgement, which comes only
  // once the owner reads the run's streams, after this call's answer (a
  // deadlock until the owner's call timed out, seen under load).
  return run;
}

QueryRunner::Env NodeImpl::hosted_env(const std::string& key, const std::string& owner_domain) {
  QueryRunner::Env env = runner_env();
  // Appends wait for the owner: an output goes out only once the owner
  // holds the journal that led to it (the top of this file).
  env.when_replicated = [this, domain = owner_domain, key](const std::string& stream, uint64_t last,
                                                           std::function<void(const Status&)> release) {
    {
      std::lock_guard lock(hosted_mu_);
      auto it = hosting_here_.find(key);
      if (it == hosting_here_.end() || !it->second.runner || hosted_stopping_) {
        release(make_error(Errc::conflict, "the hosted run ended"));  // (not asked again)
        return;
      }
      auto first = it->second.first.find(stream);
      if (first == it->second.first.end() || last >= first->second) {
        ack_waits_.push_back(AckWait{stream, domain, last, std::move(release)});
        release = nullptr;
      }
    }
    if (release) {
      release(Status::Ok());  // before the stream's first tuple: nothing to wait for
      return;
    }
    // Acknowledged already? (Asked outside hosted_mu_: the acknowledgements'
    // listener calls on_hosted_ack holding their own lock.)
    if (auto acked = peering_->acked(stream, domain)) on_hosted_ack(stream, domain, *acked);
  };
  return env;
}

void NodeImpl::end_hosted_here(const std::string& key, bool release) {
  std::shared_ptr<QueryRunner> run;
  std::vector<std::string> mirrors, streams;
  std::vector<std::function<void(const Status&)>> waiting;
  {
    std::lock_guard lock(hosted_mu_);
    auto it = hosting_here_.find(key);
    if (it == hosting_here_.end()) return;
    run = std::move(it->second.runner);
    it->second.runner = nullptr;
    if (!run) run = std::move(it->second.standby);
    it->second.standby = nullptr;
    mirrors = it->second.mirrors;
    streams = it->second.streams;
    for (auto w = ack_waits_.begin(); w != ack_waits_.end();) {
      if (std::find(streams.begin(), streams.end(), w->stream) != streams.end()) {
        waiting.push_back(std::move(w->release));
        w = ack_waits_.erase(w);
      } else {
        ++w;
      }
    }
    if (release) hosting_here_.erase(it);
  }
  // A run waiting on the owner's acknowledgement gives up (its output
  // never goes out: the owner recovers it).
  for (auto& w : waiting) w(make_error(Errc::conflict, "the hosted run ended"));
  if (run) run->stop();
  if (!release) return;
  for (const auto& m : mirrors) {
    (void)peering_->forget_import(m);
    StreamPtr s;
    {
      std::lock_guard lock(hosted_mu_);
      auto h = hosted_streams_.find(m);
      if (h != hosted_streams_.end()) {
        s = h->second;
        hosted_streams_.erase(h);
      }
    }
    if (s) {
      s->close();
      (void)store::StreamLog::drop(*store_, s->meta().id);
    }
  }
  for (const auto& name : streams) {
    StreamPtr s;
    {
      std::lock_guard lock(hosted_mu_);
      auto h = hosted_streams_.find(name);
      if (h == hosted_streams_.end()) continue;
      s = h->second;
      hosted_streams_.erase(h);
    }
    s->close();
    (void)store::StreamLog::drop(*store_, s->meta().id);
  }
  log_line(LogLevel::info, "hosting", "hosted run " + key + " ended");
}

void NodeImpl::report_hosted_usage() {
  federation::Hosting* hosting = peering_ ? peering_->hosting() : nullptr;
  contracts::Ledger* ledger = peering_ && peering_->contracting() ? &peering_->contracting()->ledger() : nullptr;
  if (!hosting) return;
  {
    std::lock_guard lock(hosted_mu_);
    if (hosting_here_.empty()) return;  // (no peers report to build)
  }
  std::vector<std::pair<certs::Identity, std::string>> notes;
  std::vector<std::pair<std::string, uint64_t>> loads;  // contract, CPU us since the last report
  // Runs whose contract left force, or whose owner's link went down, long
  // enough ago; and why.
  std::vector<std::pair<std::string, std::string>> ended;
  const auto peers = peering_ ? peering_->peers_report() : federation::PeersReport{};
  const int64_t now = wall_clock_ms();
  const std::string grace = std::to_string(std::chrono::seconds(kHostedGrace).count()) + " s";
  {
    std::lock_guard lock(hosted_mu_);
    for (auto& [key, h] : hosting_here_) {
      if (link_up(peers, h.owner_domain, h.owner_node)) {
        h.owner_link_down_since = {};
      } else if (h.owner_link_down_since == Clock::time_point{}) {
        h.owner_link_down_since = Clock::now();
      } else if (Clock::now() - h.owner_link_down_since > kHostedGrace) {
        ended.emplace_back(key, "the link to its owner's node " + h.owner_domain + "/" + h.owner_node +
                                    " is down for " + grace);
        continue;
      }
      if (ledger) {
        auto c = ledger->get(h.contract);
        // A revocation with notice ends the run when the notice does.
        if (c.ok() && (c->in_force(now) || c->in_notice(now))) {
          h.out_of_force_since = {};
        } else if (h.out_of_force_since == Clock::time_point{}) {
          h.out_of_force_since = Clock::now();
        } else if (Clock::now() - h.out_of_force_since > kHostedGrace) {
          ended.emplace_back(key, "its contract is out of force for " + grace);
          continue;
        }
      }
      if (!h.runner) continue;
      const QueryInfo info = h.runner->info();
      if (info.cpu_seconds > h.reported_cpu) {
        loads.emplace_back(h.contract, static_cast<uint64_t>((info.cpu_seconds - h.reported_cpu) * 1e6));
        h.reported_cpu = info.cpu_seconds;
      }
      JsonOut j;
      j.begin_object().key("query").str(h.query).key("fragment").str(h.fragment);
      j.key("cpu_seconds").dbl(info.cpu_seconds).key("cpu_ms_per_s").dbl(info.cpu_ms_per_s).end_object();
      notes.emplace_back(certs::Identity{h.owner_domain, h.owner_node}, members_of(j.take()));
    }
  }
  // The host's ledger counts what it ran; the owner's counts what it is told.
  for (const auto& [contract, us] : loads)
    if (ledger) (void)ledger->add_load(contract, us);
  for (const auto& [owner, fields] : notes) (void)hosting->notify(owner, "hosting.usage", fields);
  // The owner did not end them (it restarted, or its link is gone): the
  // host does, so that nothing of them stays here.
  for (const auto& [key, why] : ended) {
    log_line(LogLevel::info, "hosting", "hosted run " + key + ": " + why + "; ending it");
    end_hosted_here(key, true);
  }
}

// ----------------------------------------------------------------- thread

std::vector<std::shared_ptr<QueryRunner>> NodeImpl::checkpointed_runners() {
  std::vector<std::shared_ptr<QueryRunner>> runners = list_queries();
  // A hosted run checkpoints at this node's interval, as a query here
  // would: each checkpoint reaches the owner's state stream through the
  // relay, so a take-back replays little.
  std::lock_guard lock(hosted_mu_);
  for (const auto& [_, h] : hosting_here_)
    if (h.runner) runners.push_back(h.runner);
  return runners;
}

void NodeImpl::hosted_loop() {
  auto last_check = Clock::now();
  for (;;) {
    std::function<void()> job;
    bool any_hosted = false;
    {
      std::unique_lock lock(hosted_mu_);
      hosted_cv_.wait_for(lock, kLoopPeriod,
                          [this] { return hosted_stopping_ || !hosted_jobs_.empty(); });
      if (hosted_stopping_) return;
      if (!hosted_jobs_.empty()) {
        job = std::move(hosted_jobs_.front());
        hosted_jobs_.pop_front();
      }
      any_hosted = !hosted_.empty() || !hosting_here_.empty();
    }
    if (job) job();
    if (!any_hosted) continue;
    warm_hosted_standbys();
    relay_hosted();
    if (Clock::now() - last_check >= std::chrono::seconds(1)) {
      last_check = Clock::now();
      check_hosted();
      report_hosted_usage();
    }
  }
}

void NodeImpl::stop_hosted() {
  std::vector<std::shared_ptr<QueryRunner>> runs;
  std::vector<std::function<void(const Status&)>> waiting;
  {
    std::lock_guard lock(hosted_mu_);
    hosted_stopping_ = true;
    for (auto& [_, h] : hosting_here_)
      if (h.runner) runs.push_back(h.runner);
    for (auto& w : ack_waits_) waiting.push_back(std::move(w.release));
    ack_waits_.clear();
  }
  hosted_cv_.notify_all();
  for (auto& w : waiting) w(make_error(Errc::conflict, "this node is stopping"));
  for (auto& r : runs) r->stop();
  if (hosted_thread_.joinable()) hosted_thread_.join();
}

}  // namespace entente::broker::detail
