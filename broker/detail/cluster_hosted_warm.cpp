// The warm standby of a fragment moved to a node of another domain
// (docs/cluster.md, "Moving a fragment to another domain"): the state goes
// to the host before the pause, not in it, as a slide within the domain
// does with its standby (cluster_standby.cpp).
//
//   1. Before the fragment stops, the owner grants the host reads of the
//      fragment's state stream as well as of its inputs, and calls
//      hosting.warm with the fragment's definition, the positions its
//      checkpoints may need (QueryRunner::pin) and its state stream's name.
//   2. The host imports hidden copies of the inputs from those positions
//      and of the state stream from its oldest retained record (the start
//      of its last checkpoint), and builds a standby over them
//      (QueryRunner::begin_warm): the last checkpoint restored, the journal
//      replayed as the copy grows, the outputs counted, never written.
//   3. The owner asks (hosting.warm without a body) until the standby is
//      within kWarmSlack journal entries of the runner here, then stops the
//      runner, without a snapshot, and calls hosting.run with "warm": the
//      host waits until its copy holds the state stream's last records,
//      replays the journal's end and continues writing to hidden streams
//      that start at the owner's next numbers (QueryRunner::promote_to).
//      What follows is the hosted run of cluster_hosted.cpp.
//
// A standby that cannot be built or does not catch up within kWarmWait
// costs nothing but time: the move sends the state in the pause instead.

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "broker/detail/hosted_calls.h"
#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "contracts/hosting.h"
#include "engine/fragments.h"
#include "engine/network.h"
#include "federation/hosting.h"
#include "federation/peering.h"
#include "rapidjson/document.h"
#include "store/stream_log.h"

namespace entente::broker::detail {
namespace {

using namespace hosted;

// The standby built and caught up (a large checkpoint restores in this
// time), then within this many journal entries of the runner.
constexpr auto kWarmWait = std::chrono::seconds(60);
constexpr uint64_t kWarmSlack = 16;
constexpr auto kWarmPoll = std::chrono::milliseconds(20);
// In the pause: the copy getting the state stream's last records, the
// standby replaying them.
constexpr auto kPromoteWait = std::chrono::seconds(5);
// A standby whose move never came.
constexpr auto kStandbyIdle = std::chrono::seconds(120);

}  // namespace

Result<hosted::Definition> hosted::read_definition(federation::Hosting& hosting, const std::string& owner_domain,
                                                   const rapidjson::Value& call, const std::string& query,
                                                   const std::string& fragment) {
  auto refused = [](const std::string& why) { return make_error(Errc::invalid_argument, why); };
  if (!call.HasMember("body") || !call["body"].IsObject()) return refused("'body' must be the fragment's definition");
  const rapidjson::Value& b = call["body"];
  if (!b.HasMember("network") || !b["network"].IsObject()) return refused("'body.network' is required");
  Definition def;
  def.network_json = json_text(b["network"]);
  const uint64_t load = std::clamp<uint64_t>(u64_of(call, "load"), 1, contracts::kMaxLoad);
  const auto check = hosting.check(owner_domain, federation::Hosting::Offer{query, fragment, def.network_json, load});
  if (!check.admitted) return refused(check.reason);
  def.contract = check.contract;
  Diagnostics diag;
  auto net = engine::QueryNetwork::parse(def.network_json, diag);
  if (!net.ok()) return refused("the fragment's network does not validate: " + diag.to_string());
  def.net = std::move(net).value();
  if (b.HasMember("reads") && b["reads"].IsArray())
    for (const auto& r : b["reads"].GetArray())
      if (r.IsObject() && r.HasMember("stream") && r["stream"].IsString()) def.reads.insert(r["stream"].GetString());
  if (b.HasMember("writes") && b["writes"].IsArray())
    for (const auto& w : b["writes"].GetArray())
      if (w.IsString()) def.writes.insert(w.GetString());
  return def;
}

// ------------------------------------------------------------ owner side

std::string NodeImpl::warm_on_host(federation::Hosting& hosting, const certs::Identity& host,
                                   const std::string& contract, const std::string& body, uint64_t load,
                                   const std::shared_ptr<QueryRunner>& q) {
  const QueryMeta& meta = q->meta();
  const StreamPtr state_log = q->state_stream();
  if (!state_log) return "the fragment has no state stream";
  JsonOut w;
  w.begin_object().key("query").str(meta.query).key("fragment").str(meta.fragment).key("contract").str(contract);
  w.key("body").raw(body).key("load").u64(load).key("state").str(meta.state_stream);
  w.key("state_next").u64(state_log->committed_next()).key("positions").begin_array();
  for (size_t i = 0; i < meta.inputs.size(); ++i) w.u64(q->pin(i));
  w.end_array().end_object();
  auto built = call_host(hosting, host, "hosting.warm", members_of(w.take()), kCallWait);
  if (!built.ok()) return built.error().message;
  JsonOut a;
  a.begin_object().key("query").str(meta.query).key("fragment").str(meta.fragment).end_object();
  const std::string ask = members_of(a.take());
  const auto until = Clock::now() + kWarmWait;
  for (;;) {
    auto st = call_host(hosting, host, "hosting.warm", ask, kEndWait);
    if (!st.ok()) return st.error().message;
    rapidjson::Document d;
    d.Parse(st->data(), st->size());
    const uint64_t have = d.IsObject() ? u64_of(d, "journal_next") : 0;
    const uint64_t want = q->journal_next();
    if (d.IsObject() && str_of(d, "state") == "warm" && have + kWarmSlack >= want) return {};
    if (Clock::now() >= until) {
      const std::string waiting = d.IsObject() ? str_of(d, "waiting") : std::string();
      return "the standby did not catch up within " + std::to_string(std::chrono::seconds(kWarmWait).count()) +
             " s (journal " + std::to_string(have) + " of " + std::to_string(want) +
             (waiting.empty() ? "" : "; " + waiting) + ")";
    }
    std::this_thread::sleep_for(kWarmPoll);
  }
}

// ------------------------------------------------------------- host side

std::string NodeImpl::hosted_inputs(const std::string& owner_domain, const engine::QueryNetwork& net,
                                    const std::set<std::string>& reads, const std::vector<uint64_t>& positions,
                                    QueryMeta& meta, std::vector<std::pair<std::string, engine::SchemaPtr>>& copies) {
  for (size_t i = 0; i < net.inputs().size(); ++i) {
    const auto& in = net.inputs()[i];
    const bool internal = reads.count(in.name) != 0;
    std::string stream = internal ? in.name : in.stream.empty() ? in.name : in.stream;
    if (stream.starts_with(owner_domain + "/")) stream = stream.substr(owner_domain.size() + 1);
    if (stream.find('/') != std::string::npos)
      return "input " + in.name + " reads " + stream + ", not a stream of " + owner_domain;
    const std::string mirror = owner_domain + "/" + stream;
    if (internal) meta.internal_inputs.push_back(static_cast<uint32_t>(i));
    meta.inputs.push_back(mirror);
    meta.start.push_back(i < positions.size() ? positions[i] : 0);
    copies.emplace_back(mirror, internal ? engine::internal_stream_schema(*in.schema) : in.schema);
  }
  return {};
}

void NodeImpl::serve_hosted_warm(const certs::Identity& owner, const std::string& message,
                                 std::function<void(bool, const std::string&, const std::string&)> answer) {
  rapidjson::Document d;
  d.Parse(message.data(), message.size());
  const std::string query = str_of(d, "query"), fragment = str_of(d, "fragment");
  const std::string runner = engine::fragment_network_name(query, fragment);
  const std::string key = owner.domain + "/" + runner;
  if (!d.HasMember("body")) {
    // How far it is.
    std::lock_guard lock(hosted_mu_);
    auto it = hosting_here_.find(key);
    if (it == hosting_here_.end() || it->second.runner || !it->second.standby) {
      const std::string why = it == hosting_here_.end() ? std::string()
                              : it->second.runner   ? ": it runs here already"
                              : it->second.standby_error.empty() ? std::string()
                                                                 : ": " + it->second.standby_error;
      answer(false, "no standby of fragment " + fragment + " of query '" + query + "' on " + config_.node + why, "");
      return;
    }
    const HostedHere& h = it->second;
    JsonOut j;
    j.begin_object().key("state").str(h.standby_warm ? "warm" : "building");
    j.key("journal_next").u64(h.standby_journal).key("waiting").str(h.standby_error).end_object();
    answer(true, "", j.take());
    return;
  }
  post_hosted([this, owner, message, answer] { build_hosted_standby(owner, message, answer); });
}

void NodeImpl::build_hosted_standby(const certs::Identity& owner, const std::string& message,
                                    std::function<void(bool, const std::string&, const std::string&)> answer) {
  rapidjson::Document d;
  d.Parse(message.data(), message.size());
  const std::string query = str_of(d, "query"), fragment = str_of(d, "fragment");
  const std::string runner = engine::fragment_network_name(query, fragment);
  const std::string key = owner.domain + "/" + runner;
  auto refuse = [&](const std::string& why) {
    log_line(LogLevel::warn, "hosting", "a standby of fragment " + fragment + " of query '" + query + "' for " + owner.uri() +
             ": refused: " + why);
    answer(false, why, "");
  };
  federation::Hosting* hosting = peering_ ? peering_->hosting() : nullptr;
  if (!hosting) return refuse("the federation is not started here");
  // The contract, as for the run itself (hosting.run checks it again).
  auto def = read_definition(*hosting, owner.domain, d, query, fragment);
  if (!def.ok()) return refuse(def.error().message);
  const std::string& network_json = def->network_json;
  const engine::QueryNetwork* net = &*def->net;
  const std::set<std::string>& reads = def->reads;
  const std::set<std::string>& writes = def->writes;
  const std::vector<uint64_t> positions = u64s(d, "positions");
  if (positions.size() != net->inputs().size())
    return refuse("'positions' must hold one number per input of the network");
  const std::string state = str_of(d, "state");
  if (state.empty() || state.size() > 200 || state.find('/') != std::string::npos)
    return refuse("'state' must name the fragment's state stream in " + owner.domain);
  bool replace = false;
  {
    std::lock_guard lock(hosted_mu_);
    auto it = hosting_here_.find(key);
    if (it != hosting_here_.end() && it->second.runner) return refuse("this node hosts that fragment already");
    replace = it != hosting_here_.end();
    if (!replace && hosting_here_.size() >= kMaxHostedHere)
      return refuse(config_.node + " hosts " + std::to_string(kMaxHostedHere) + " fragments already");
  }
  if (replace) end_hosted_here(key, true);  // an earlier move's standby
  {
    std::lock_guard lock(hosted_mu_);
    HostedHere& h = hosting_here_[key];
    h = HostedHere{owner.domain, owner.node, def->contract, query, fragment, nullptr, {}, {}, {}};
    h.standby_since = Clock::now();
  }
  auto forget = [&](const std::string& why) {
    end_hosted_here(key, true);
    refuse(why);
  };
  QueryMeta meta;
  meta.name = runner;
  meta.query = query;
  meta.fragment = fragment;
  meta.network_json = network_json;
  meta.created_ms = wall_clock_ms();
  std::vector<std::pair<std::string, engine::SchemaPtr>> copies;
  if (const std::string error = hosted_inputs(owner.domain, *net, reads, positions, meta, copies); !error.empty())
    return forget(error);
  // The state stream, from the oldest record the owner keeps: its last
  // checkpoint's first.
  const std::string state_copy = owner.domain + "/" + state;
  copies.emplace_back(state_copy, state_stream_schema());
  std::vector<uint64_t> from = meta.start;
  from.push_back(0);
  if (const std::string error = open_hosted_copies(key, owner.domain, copies, from); !error.empty())
    return forget(error);
  std::vector<StreamPtr> ins;
  for (size_t i = 0; i + 1 < copies.size(); ++i) {
    StreamPtr s = find_hosted_stream(copies[i].first);
    if (!s) s = find_stream(copies[i].first);  // this node imported it for itself already
    if (!s) return forget("the copy of " + copies[i].first + " is not here");
    ins.push_back(s);
  }
  StreamPtr copy = find_hosted_stream(state_copy);
  if (!copy) return forget("the copy of " + state_copy + " is not here");
  // Its outputs, counted and never written: streams of no store, with the
  // outputs' schemas; hosting.run gives it the real ones.
  std::vector<StreamPtr> counted;
  for (size_t o = 0; o < net->outputs().size(); ++o) {
    const auto& out = net->outputs()[o];
    const bool internal = writes.count(out.name) != 0;
    if (internal) meta.internal_outputs.push_back(static_cast<uint32_t>(o));
    StreamMeta sm;
    sm.name = hidden_name(key, "w" + std::to_string(o));
    sm.schema = internal ? engine::internal_stream_schema(*out.schema) : out.schema;
    meta.outputs.push_back(sm.name);
    counted.push_back(std::make_shared<Stream>(std::move(sm), 1));
  }
  meta.state_stream = state_copy;
  auto created = QueryRunner::create(meta, ins, counted, hosted_env(key, owner.domain), copy);
  if (!created.ok()) return forget("the fragment does not run here: " + created.error().message);
  (*created)->begin_warm();
  {
    std::lock_guard lock(hosted_mu_);
    HostedHere& h = hosting_here_[key];
    h.standby = *created;
    h.state_copy = state_copy;
    h.state_copy_ready = u64_of(d, "state_next");
    h.standby_error = "its copy of " + state + " is arriving";
  }
  log_line(LogLevel::info, "hosting", "a standby of fragment " + fragment + " of query '" + query + "' for " + owner.uri() +
           " is being built under contract " + def->contract);
  answer(true, "", R"({"state":"building"})");
}

void NodeImpl::warm_hosted_standbys() {
  std::vector<std::pair<std::string, std::shared_ptr<QueryRunner>>> work;
  std::vector<std::string> idle;
  {
    std::lock_guard lock(hosted_mu_);
    const auto now = Clock::now();
    for (auto& [key, h] : hosting_here_) {
      if (!h.standby || h.runner) continue;
      if (now - h.standby_since > kStandbyIdle) {
        idle.push_back(key);
        continue;
      }
      if (!h.standby_warm) {
        // Its first call restores the last checkpoint: once the copy holds
        // what the owner's stream held when the move asked.
        auto c = hosted_streams_.find(h.state_copy);
        const uint64_t held = c == hosted_streams_.end() ? 0 : c->second->committed_next();
        if (held < h.state_copy_ready) continue;
      }
      work.emplace_back(key, h.standby);
    }
  }
  for (const auto& key : idle) {
    log_line(LogLevel::warn, "hosting", "the standby of hosted run " + key + " was not taken over within " +
             std::to_string(std::chrono::seconds(kStandbyIdle).count()) + " s: dropped");
    end_hosted_here(key, true);
  }
  for (const auto& [key, standby] : work) {
    auto r = standby->warm();
    std::shared_ptr<QueryRunner> failed;
    {
      std::lock_guard lock(hosted_mu_);
      auto it = hosting_here_.find(key);
      if (it == hosting_here_.end() || it->second.standby != standby) continue;
      HostedHere& h = it->second;
      if (r.ok()) {
        if (!h.standby_warm)
          log_line(LogLevel::info, "hosting", "the standby of hosted run " + key + " is warm: its checkpoint restored, the journal replayed to " +
                   std::to_string(*r));
        h.standby_journal = *r;
        h.standby_warm = true;
        h.standby_error.clear();
        continue;
      }
      h.standby_error = r.error().message;
      if (r.error().code == Errc::unavailable) continue;  // an input range not copied yet
      failed = std::move(h.standby);
      h.standby = nullptr;
    }
    // It cannot go on: the owner's next question hears why, and the move
    // sends the state in the pause instead.
    log_line(LogLevel::warn, "hosting", "the standby of hosted run " + key + " stops: " + r.error().message);
    failed->stop();
  }
}

std::string NodeImpl::promote_hosted_standby(const std::string& key, uint64_t state_next, uint64_t journal_next,
                                             const std::vector<StreamPtr>& outs,
                                             const std::vector<std::string>& out_names, const StreamPtr& state_log,
                                             const std::string& state_name, double& catch_up_ms) {
  std::shared_ptr<QueryRunner> standby;
  StreamPtr copy;
  std::string copy_name;
  {
    std::lock_guard lock(hosted_mu_);
    auto it = hosting_here_.find(key);
    if (it == hosting_here_.end() || !it->second.standby) return "no warm standby of the fragment here";
    standby = it->second.standby;
    copy_name = it->second.state_copy;
    auto c = hosted_streams_.find(copy_name);
    if (c != hosted_streams_.end()) copy = c->second;
  }
  if (!copy) return "the copy of " + copy_name + " is gone";
  const auto t0 = Clock::now();
  const auto until = t0 + kPromoteWait;
  // The state stream's last records (the journal up to where the owner
  // stopped) reach the copy.
  while (copy->committed_next() < state_next) {
    if (Clock::now() >= until)
      return "the copy of " + copy_name + " holds up to " + std::to_string(copy->committed_next() - 1) + " of " +
             std::to_string(state_next - 1) + " after " +
             std::to_string(std::chrono::seconds(kPromoteWait).count()) + " s";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (;;) {
    Status st = standby->promote_to(journal_next, outs, out_names, state_log, state_name);
    if (st.ok()) break;
    if (st.error().code != Errc::unavailable || Clock::now() >= until) return st.error().message;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  catch_up_ms = ms_between(t0, Clock::now());
  {
    std::lock_guard lock(hosted_mu_);
    HostedHere& h = hosting_here_[key];
    h.runner = standby;
    h.standby = nullptr;
    h.standby_error.clear();
    h.mirrors.erase(std::remove(h.mirrors.begin(), h.mirrors.end(), copy_name), h.mirrors.end());
  }
  standby->start();
  // (Its first checkpoint: at the node's interval, start_hosted_runner says
  // why not at once.)
  // The copy of the owner's state stream is read no more: the run writes
  // its own, which the owner relays into that very stream.
  (void)peering_->forget_import(copy_name);
  {
    std::lock_guard lock(hosted_mu_);
    hosted_streams_.erase(copy_name);
  }
  copy->close();
  (void)store::StreamLog::drop(*store_, copy->meta().id);
  return {};
}

}  // namespace entente::broker::detail
