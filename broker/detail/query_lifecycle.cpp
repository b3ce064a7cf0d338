// A query over its lifetime (docs/query-networks.md, "Queries over their
// lifetime"): where a new query's inputs start ("start_from"), input
// schemas taken from the streams, stopping and starting a query, and
// replacing its network while the boxes that did not change keep their
// state. On a domain of several nodes stop and start go through each
// fragment's node (cluster_lifecycle.cpp); a replacement there serves a
// query that runs whole on one node, not one run as fragments (501).

#include <algorithm>
#include <map>
#include <set>

#include "broker/detail/json_in.h"
#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "cluster/catalog.h"
#include "engine/codec.h"
#include "engine/network.h"
#include "engine/splits.h"
#include "rapidjson/document.h"

namespace entente::broker::detail {

using http::Request;
using http::Respond;
using http::Response;

namespace {

constexpr size_t kMaxStartNames = 256;   // as many as a network has inputs
constexpr size_t kMaxDropState = 1000;   // as many as a network has boxes
constexpr size_t kMaxNameChars = 128;

Result<StartPoint> read_start_point(const rapidjson::Value& v, const std::string& path) {
  if (v.IsString()) {
    const std::string_view s(v.GetString(), v.GetStringLength());
    if (s == "earliest") return StartPoint{StartPoint::Kind::earliest, 0};
    if (s == "latest") return StartPoint{StartPoint::Kind::latest, 0};
  } else if (v.IsUint64() && v.GetUint64() >= 1) {
    return StartPoint{StartPoint::Kind::seq, v.GetUint64()};
  }
  return make_error(Errc::invalid_argument,
                    path + ": expected \"earliest\", \"latest\" or a sequence number (1 or more)");
}

Status read_start_from(const rapidjson::Value& v, QueryOptions& o) {
  o.start_given = true;
  if (v.IsString()) {
    ENTENTE_ASSIGN_OR_RETURN(o.start_all, read_start_point(v, "$.start_from"));
    if (o.start_all.kind == StartPoint::Kind::seq)
      return make_error(Errc::invalid_argument, "$.start_from: a sequence number is given per input: {\"INPUT\": SEQ}");
    return Status::Ok();
  }
  if (!v.IsObject())
    return make_error(Errc::invalid_argument,
                      "$.start_from: expected \"earliest\", \"latest\" or an object {\"INPUT\": SEQ, ...}");
  if (v.MemberCount() > kMaxStartNames)
    return make_error(Errc::invalid_argument, "$.start_from: at most " + std::to_string(kMaxStartNames) + " inputs");
  for (const auto& m : v.GetObject()) {
    std::string key(m.name.GetString(), m.name.GetStringLength());
    if (key.empty() || key.size() > kMaxNameChars)
      return make_error(Errc::invalid_argument, "$.start_from: an input name has 1 to 128 characters");
    ENTENTE_ASSIGN_OR_RETURN(auto p, read_start_point(m.value, "$.start_from." + key));
    if (!o.start_by.emplace(key, p).second)
      return make_error(Errc::invalid_argument, "$.start_from." + key + ": given twice");
  }
  return Status::Ok();
}

Status read_drop_state(const rapidjson::Value& v, QueryOptions& o) {
  if (!v.IsArray() || v.Size() > kMaxDropState)
    return make_error(Errc::invalid_argument, "$.drop_state: expected an array of at most 1000 box ids");
  for (rapidjson::SizeType i = 0; i < v.Size(); ++i) {
    if (!v[i].IsString() || v[i].GetStringLength() == 0 || v[i].GetStringLength() > kMaxNameChars)
      return make_error(Errc::invalid_argument, "$.drop_state[" + std::to_string(i) + "]: expected a box id");
    o.drop_state.emplace(v[i].GetString(), v[i].GetStringLength());
  }
  return Status::Ok();
}

std::string diag_members(const Diagnostics& diag) {
  JsonOut j;
  j.begin_array();
  for (auto& d : diag.items()) j.begin_object().key("path").str(d.path).key("message").str(d.message).end_object();
  j.end_array();
  return "\"errors\":" + j.take();
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
  return s.empty() ? "none" : s;
}

// Boxes whose state a filter or a map does not have: a changed definition
// is simply the new one.
bool stateless(const std::string& type) { return type == "filter" || type == "map"; }

}  // namespace

Response problem_with(const Error& e, const Diagnostics& diag) {
  if (diag.ok()) return problem_for(e);
  return Response::problem(400, "Bad Request",
                           e.message + ": " + std::to_string(diag.size()) + " problem(s), first: " +
                               diag.items().front().path + ": " + diag.items().front().message,
                           diag_members(diag));
}

Result<QueryOptions> read_query_options(std::string_view body, bool allow_drop) {
  QueryOptions o;
  rapidjson::Document d;
  d.Parse(body.data(), body.size());
  if (d.HasParseError() || !d.IsObject()) {
    o.network_json = std::string(body);  // the engine reports the problem
    return o;
  }
  bool changed = false;
  if (auto it = d.FindMember("start_from"); it != d.MemberEnd()) {
    ENTENTE_RETURN_IF_ERROR(read_start_from(it->value, o));
    d.RemoveMember("start_from");
    changed = true;
  }
  if (auto it = d.FindMember("drop_state"); it != d.MemberEnd()) {
    if (!allow_drop)
      return make_error(Errc::invalid_argument,
                        "$.drop_state: only a replacement of a query's network (PUT /v1/queries/{name}) drops state");
    ENTENTE_RETURN_IF_ERROR(read_drop_state(it->value, o));
    d.RemoveMember("drop_state");
    changed = true;
  }
  o.network_json = changed ? json_text(d) : std::string(body);
  return o;
}

std::string schema_difference(const engine::Schema& declared, const engine::Schema& stream) {
  std::string first;
  const size_t n = std::max(declared.size(), stream.size());
  for (size_t i = 0; i < n && first.empty(); ++i) {
    auto show = [i](const engine::Schema& s) {
      if (i >= s.size()) return std::string("nothing");
      return "'" + s.field(i).name + ":" + std::string(engine::type_name(s.field(i).type)) + "'";
    };
    if (i >= declared.size() || i >= stream.size() || !(declared.field(i) == stream.field(i)))
      first = "field " + std::to_string(i) + " is " + show(declared) + " here and " + show(stream) + " in the stream";
  }
  return "whose schema is " + stream.to_string() + ": " + first + " (declared: " + declared.to_string() +
         "). Leave \"schema\" out to take the stream's";
}

std::string NodeImpl::fill_input_schemas(std::string_view network_json) const {
  rapidjson::Document d;
  d.Parse(network_json.data(), network_json.size());
  if (d.HasParseError() || !d.IsObject()) return std::string(network_json);
  auto inputs = d.FindMember("inputs");
  if (inputs == d.MemberEnd() || !inputs->value.IsArray()) return std::string(network_json);
  bool changed = false;
  for (auto& in : inputs->value.GetArray()) {
    if (!in.IsObject() || in.HasMember("schema")) continue;
    auto pick = in.FindMember("stream");
    if (pick == in.MemberEnd()) pick = in.FindMember("name");
    if (pick == in.MemberEnd() || !pick->value.IsString()) continue;
    std::string stream(pick->value.GetString(), pick->value.GetStringLength());
    if (stream.rfind(config_.domain + "/", 0) == 0) stream = stream.substr(config_.domain.size() + 1);
    // A stream of this node, else of the domain (its catalog entry); not
    // a stream of either: the engine says the schema is missing.
    engine::SchemaPtr found;
    if (auto s = find_stream(stream)) found = s->meta().schema;
    else if (catalog_) {
      if (auto e = catalog_->get("streams/" + stream)) {
        if (auto entry = stream_entry_from_json(e->value); entry.ok()) found = entry->meta.schema;
      }
    }
    if (!found) continue;
    rapidjson::Document schema(&d.GetAllocator());
    const std::string text = engine::schema_to_json(*found);
    schema.Parse(text.data(), text.size());
    in.AddMember("schema", rapidjson::Value(schema, d.GetAllocator()), d.GetAllocator());
    changed = true;
  }
  return changed ? json_text(d) : std::string(network_json);
}

uint64_t NodeImpl::start_position(const engine::NetworkInput& in, const Stream& stream, const QueryOptions* options,
                                  std::string& conflict) const {
  const uint64_t head = stream.visible_next();
  if (!options) return head;
  StartPoint p = options->start_all;
  std::string key;  // ".NAME" when start_from names this input
  for (const std::string& k : {in.name, in.stream, stream.meta().name}) {
    if (auto it = options->start_by.find(k); !k.empty() && it != options->start_by.end()) {
      p = it->second;
      key = "." + k;
      break;
    }
  }
  if (p.kind == StartPoint::Kind::latest) return head;
  auto first_rec = store::StreamLog::first(*store_, stream.meta().id);
  const uint64_t first = first_rec.ok() && *first_rec ? std::min((*first_rec)->first, head) : head;
  if (p.kind == StartPoint::Kind::earliest) return first;
  const std::string what = "$.start_from" + key + ": ";
  if (p.seq > head && conflict.empty())
    conflict = what + std::to_string(p.seq) + " is past the head of stream '" + stream.meta().name +
               "': its next tuple will be " + std::to_string(head);
  else if (p.seq < first && conflict.empty())
    conflict = what + "tuple " + std::to_string(p.seq) + " is no longer in stream '" + stream.meta().name +
               "': the first it holds is " + std::to_string(first) + " (retention)";
  return std::clamp(p.seq, first, head);
}

void NodeImpl::check_start_names(const engine::QueryNetwork& net, const QueryOptions* options,
                                 Diagnostics& diag) const {
  if (!options) return;
  std::set<std::string> known;
  std::vector<std::string> names;
  for (const auto& in : net.inputs()) {
    known.insert(in.name);
    names.push_back(in.name);
    if (in.stream.empty()) continue;
    known.insert(in.stream);
    if (in.stream.rfind(config_.domain + "/", 0) == 0) known.insert(in.stream.substr(config_.domain.size() + 1));
  }
  for (const auto& [k, _] : options->start_by)
    if (!known.count(k))
      diag.error("$.start_from." + k.substr(0, 64), "no input or stream '" + k.substr(0, 64) +
                                                         "' in the network (its inputs: " + quoted_list(names) + ")");
}

// --- routes

std::optional<QueryOptions> NodeImpl::query_body(const Request& req, bool allow_drop, const Respond& answer) {
  auto o = read_query_options(req.body, allow_drop);
  if (!o.ok()) {
    answer(problem_for(o.error()));
    return std::nullopt;
  }
  o->network_json = fill_input_schemas(o->network_json);
  return std::move(o).value();
}

std::shared_ptr<QueryRunner> NodeImpl::lifecycle_target(const std::string& name, const char* what,
                                                        const Respond& answer) {
  auto q = find_query(name);
  if (!q) answer(Response::problem(404, "Not Found", "no query '" + name.substr(0, 100) + "'"));
  else if (!q->meta().fragment.empty())
    answer(Response::problem(409, "Conflict", std::string(what) + ": '" + name.substr(0, 100) + "' is a fragment "
                                              "of query '" + q->meta().query + "'; address the query"));
  else return q;
  return nullptr;
}

void NodeImpl::stop_query_route(const Request& req, const PathParams& params, const Respond& answer) {
  // A query of a domain of several nodes: through each fragment's node.
  if (catalog_ && cluster_lifecycle(req, params.at(0), true, answer)) return;
  if (!lifecycle_target(params.at(0), "stopping a query", answer)) return;
  auto q = stop_query(params.at(0));
  if (!q.ok()) answer(problem_for(q.error()));
  else answer(Response::json(200, query_json(*q, config_.domain + "/" + config_.node, peering_.get())));
}

void NodeImpl::start_query_route(const Request& req, const PathParams& params, const Respond& answer) {
  if (catalog_ && cluster_lifecycle(req, params.at(0), false, answer)) return;
  if (!lifecycle_target(params.at(0), "starting a query", answer)) return;
  auto q = start_query(params.at(0));
  if (!q.ok()) answer(problem_for(q.error()));
  else answer(Response::json(200, query_json(*q, config_.domain + "/" + config_.node, peering_.get())));
}

void NodeImpl::replace_query_route(const Request& req, const PathParams& params, const Respond& answer) {
  if (!json_body(req, answer)) return;
  if (rapidjson::Document doc; auto p = read_json(req.body, doc)) {
    // Too deep, a key twice, bad syntax: as a validation problem.
    Diagnostics diag;
    diag.error(p->path, p->why);
    answer(Response::problem(400, "Bad Request", p->message(), diag_members(diag)));
    return;
  }
  auto options = query_body(req, true, answer);
  if (!options) return;
  if (catalog_ && !find_query(params.at(0))) {
    // A query of a domain of several nodes (cluster_replace.cpp).
    if (auto cut = cut_entry(params.at(0), true)) {
      cluster_replace(req, *cut, std::move(*options), answer);
      return;
    }
    if (forward_query_if_elsewhere(req, params.at(0), answer)) return;
  }
  if (!lifecycle_target(params.at(0), "replacing a query's network", answer)) return;
  Diagnostics diag;
  auto q = replace_query(params.at(0), *options, diag);
  Response r = q.ok() ? Response::json(200, query_json(*q, config_.domain + "/" + config_.node, peering_.get()))
                      : problem_with(q.error(), diag);
  count_replacement(params.at(0), r.status);
  answer(std::move(r));
}

// --- stop and start

Status NodeImpl::put_query_meta(const QueryMeta& meta) {
  store::WriteBatch wb;
  wb.put(store::Cf::catalog, node_query_key(meta.name), query_meta_to_json(meta));
  return store_->write(wb, store::Durability::synced);
}

Result<std::shared_ptr<QueryRunner>> NodeImpl::stop_query(const std::string& name) {
  std::lock_guard life(lifecycle_mu_);
  auto q = find_query(name);
  if (!q) return make_error(Errc::not_found, "no query '" + name + "'");
  const std::string state = q->info().state;
  if (state == "stopped") return q;  // stopping a stopped query changes nothing
  if (state != "running")
    return make_error(Errc::conflict, "query '" + name + "' is " + state + "; only a running query stops");
  // The record first: a restart after it finds the query stopped, and
  // recovers it from the checkpoint and journal it has either way.
  QueryMeta meta = q->meta();
  meta.stopped = true;
  ENTENTE_RETURN_IF_ERROR(put_query_meta(meta));
  auto cp = q->pause();
  if (!cp.ok()) return make_error(cp.error().code, "stopping query '" + name + "': " + cp.error().message);
  return q;
}

Result<std::shared_ptr<QueryRunner>> NodeImpl::recovered_runner(const QueryMeta& meta) {
  std::vector<StreamPtr> ins, outs;
  for (const auto* names : {&meta.inputs, &meta.outputs}) {
    for (const auto& n : *names) {
      auto it = streams_.find(n);
      if (it == streams_.end()) return make_error(Errc::conflict, "query '" + meta.name + "': no stream '" + n + "'");
      (names == &meta.inputs ? ins : outs).push_back(it->second);
    }
  }
  // A fragment's checkpoints and journal are in its state stream.
  StreamPtr state;
  if (!meta.state_stream.empty()) {
    auto it = streams_.find(meta.state_stream);
    if (it == streams_.end())
      return make_error(Errc::conflict, "query '" + meta.name + "': no state stream '" + meta.state_stream + "'");
    state = it->second;
  }
  ENTENTE_ASSIGN_OR_RETURN(auto runner, QueryRunner::create(meta, std::move(ins), std::move(outs), runner_env(),
                                                            std::move(state)));
  ENTENTE_RETURN_IF_ERROR(runner->recover());
  return runner;
}

Result<std::shared_ptr<QueryRunner>> NodeImpl::start_query(const std::string& name) {
  std::lock_guard life(lifecycle_mu_);
  std::unique_lock lock(catalog_mu_);
  auto it = queries_.find(name);
  if (it == queries_.end()) return make_error(Errc::not_found, "no query '" + name + "'");
  auto q = it->second;
  const std::string state = q->info().state;
  if (state == "running") return q;  // starting a running query changes nothing
  if (state != "stopped")
    return make_error(Errc::conflict, "query '" + name + "' is " + state + "; only a stopped query starts");
  // Exactly where it stopped: its checkpoint, taken when it stopped.
  QueryMeta meta = q->meta();
  meta.stopped = false;
  ENTENTE_ASSIGN_OR_RETURN(auto fresh, recovered_runner(meta));
  ENTENTE_RETURN_IF_ERROR(put_query_meta(meta));
  it->second = fresh;
  fresh->start();
  return fresh;
}

// --- replacing a query's network

namespace {

std::optional<size_t> index_in(const std::vector<std::string>& v, const std::string& s) {
  auto it = std::find(v.begin(), v.end(), s);
  if (it == v.end()) return std::nullopt;
  return static_cast<size_t>(it - v.begin());
}

}  // namespace

Status plan_kept_boxes(const engine::QueryNetwork& from, const engine::QueryNetwork& to,
                       const QueryOptions& options, QueryReplacement& r, Diagnostics& diag) {
  const auto ids = to.box_ids();
  for (const auto& d : options.drop_state)
    if (std::find(ids.begin(), ids.end(), d) == ids.end())
      diag.error("$.drop_state", "no box '" + d.substr(0, 64) + "' in the new network");
  std::string refused;
  for (const auto& c : engine::compare_boxes(from, to)) {
    if (options.drop_state.count(c.id)) continue;
    if (c.same) r.kept_boxes.emplace_back(c.id, c.id);
    else if (!(stateless(c.type) && c.why.rfind("its type changed", 0) != 0))
      refused += (refused.empty() ? "" : "; ") + ("box '" + c.id + "': " + c.why);
  }
  if (!refused.empty())
    return make_error(Errc::conflict, "the state of these boxes cannot carry over to the new network: " + refused +
                                          ". Name them in \"drop_state\" to start them empty, or give them new ids");
  return Status::Ok();
}

Result<std::shared_ptr<QueryRunner>> NodeImpl::replace_query(const std::string& name, const QueryOptions& options,
                                                             Diagnostics& diag) {
  std::lock_guard life(lifecycle_mu_);
  auto net = engine::QueryNetwork::parse(options.network_json, diag);
  if (!net.ok()) return make_error(Errc::invalid_argument, "the query network is invalid");
  if (net->name() != name)
    diag.error("$.name", "'" + net->name() + "' is not the query's name '" + name + "': a replacement keeps it");
  auto old = find_query(name);
  if (!old) return make_error(Errc::not_found, "no query '" + name + "'");
  if (!old->meta().fragment.empty() || !old->meta().state_stream.empty())
    return make_error(Errc::unsupported, "query '" + name + "' is a fragment; it is not replaced by itself");
  const std::string state = old->info().state;
  if (state != "running" && state != "stopped")
    return make_error(Errc::conflict, "query '" + name + "' is " + state + "; delete it and deploy it again");
  Diagnostics ignored;
  auto from = engine::QueryNetwork::parse(old->meta().network_json, ignored);
  if (!from.ok()) return make_error(Errc::corrupt, "query '" + name + "': its stored network does not parse");
  QueryReplacement r;
  r.meta = old->meta();
  r.meta.network_json = options.network_json;
  r.meta.inputs.clear();
  r.meta.outputs.clear();
  r.meta.start.clear();
  r.meta.stopped = state == "stopped";
  Status boxes = plan_kept_boxes(*from, *net, options, r, diag);
  std::unique_lock lock(catalog_mu_);
  if (auto it = queries_.find(name); it == queries_.end() || it->second != old) return make_error(Errc::conflict, "query '" + name + "' changed meanwhile; try again");
  std::string conflict;
  plan_inputs(*net, old->meta(), options, r, diag, conflict);
  plan_outputs(*net, old->meta(), r, diag, conflict);
  if (!diag.ok()) return make_error(Errc::invalid_argument, "the new network does not fit query '" + name + "'");
  ENTENTE_RETURN_IF_ERROR(boxes);
  if (!conflict.empty()) return make_error(Errc::conflict, conflict);
  return swap_runner(old, *from, *net, std::move(r));
}


void NodeImpl::plan_inputs(const engine::QueryNetwork& net, const QueryMeta& old, const QueryOptions& options,
                           QueryReplacement& r, Diagnostics& diag, std::string& conflict) const {
  for (size_t i = 0; i < net.inputs().size(); ++i) {
    const auto& in = net.inputs()[i];
    const std::string path = "$.inputs[" + std::to_string(i) + "]";
    std::string stream_name = in.stream.empty() ? in.name : in.stream;
    if (in.stream.rfind(config_.domain + "/", 0) == 0) stream_name = in.stream.substr(config_.domain.size() + 1);
    auto it = streams_.find(stream_name);
    if (it == streams_.end()) {
      diag.error(path + (in.stream.empty() ? ".name" : ".stream"),
                 "no stream '" + stream_name + "' on this node (a replacement reads the node's streams and imports)");
      continue;
    }
    if (!(*it->second->meta().schema == *in.schema))
      diag.error(path + ".schema", "does not match stream '" + stream_name + "', " +
                                       schema_difference(*in.schema, *it->second->meta().schema));
    const auto from = index_in(old.inputs, stream_name);
    // A stream the query read already: it continues where it stands.
    for (const std::string& k : {in.name, in.stream, stream_name})
      if (from && !k.empty() && options.start_by.count(k))
        diag.error("$.start_from." + k, "input '" + in.name + "' reads '" + stream_name +
                                            "', which the query reads already: it continues where it stands; "
                                            "start_from applies to new inputs");
    r.ins.push_back(it->second);
    r.meta.inputs.push_back(stream_name);
    r.input_from.push_back(from);
    r.meta.start.push_back(from ? 0 : start_position(in, *it->second, &options, conflict));
  }
  check_start_names(net, &options, diag);
}

void NodeImpl::plan_outputs(const engine::QueryNetwork& net, const QueryMeta& old, QueryReplacement& r,
                            Diagnostics& diag, std::string& conflict) const {
  auto refuse = [&conflict](std::string why) {
    if (conflict.empty()) conflict = std::move(why);
  };
  for (size_t o = 0; o < net.outputs().size(); ++o) {
    const auto& out = net.outputs()[o];
    const std::string path = "$.outputs[" + std::to_string(o) + "].name";
    r.meta.outputs.push_back(out.name);
    const auto from = index_in(old.outputs, out.name);
    r.output_from.push_back(from);
    r.outs.push_back(nullptr);
    if (from) {
      // It continues: the same stream, so the same schema.
      auto it = streams_.find(out.name);
      if (it == streams_.end()) refuse(path + ": the query's output stream '" + out.name + "' is gone");
      else if (!(*it->second->meta().schema == *out.schema))
        refuse(path + ": output '" + out.name + "' would change its schema from (" +
               it->second->meta().schema->to_string() + ") to (" + out.schema->to_string() +
               "); a replacement keeps an output's schema: give the output a new name");
      else r.outs.back() = it->second;
      continue;
    }
    if (Status st = check_stream_name(out.name); !st.ok()) diag.error(path, st.error().message);
    else if (streams_.count(out.name)) refuse(path + ": stream '" + out.name + "' exists already");
    StreamMeta sm;
    sm.name = out.name;
    sm.schema = out.schema;
    sm.producer = "query:" + old.name;
    sm.retention = {config_.retention.max_tuples, config_.retention.max_bytes, config_.retention.max_age_ms};
    sm.created_ms = wall_clock_ms();
    r.created.push_back(std::move(sm));
  }
  for (const auto& o : old.outputs) {
    if (index_in(r.meta.outputs, o)) continue;
    r.dropped.push_back(o);
    for (const auto& [other, q] : queries_)
      if (other != old.name && index_in(q->meta().inputs, o))
        refuse("query '" + other + "' reads '" + o + "', an output the new network of '" + old.name +
               "' no longer writes; delete that query first, or keep the output");
  }
}

StreamPtr NodeImpl::new_output_stream(StreamMeta sm) {
  auto s = std::make_shared<Stream>(std::move(sm), 1);
  s->tuples_in = &metrics_.counter("entente_stream_tuples_total", "Tuples appended to a stream",
                                   {{"stream", s->meta().name}});
  s->bytes_in = &metrics_.counter("entente_stream_bytes_total", "Encoded bytes appended to a stream",
                                  {{"stream", s->meta().name}});
  return s;
}

Result<std::shared_ptr<QueryRunner>> NodeImpl::swap_runner(const std::shared_ptr<QueryRunner>& old,
                                                           const engine::QueryNetwork& from,
                                                           const engine::QueryNetwork& to, QueryReplacement r) {
  const std::string name = old->meta().name;
  const bool was_running = !r.meta.stopped;
  if (was_running) old->stop();
  // Undoing: the old runner's state is where it was (nothing was written
  // for the new one), so a runner recovered from it continues exactly.
  auto resume = [&](const Error& e) -> Error {
    if (!was_running) return e;
    if (auto fresh = recovered_runner(old->meta()); fresh.ok()) {
      queries_[name] = *fresh;
      (*fresh)->start();
    } else {
      log_line(LogLevel::warn, "query", "query '" + name + "' did not resume after a failed replacement: " + fresh.error().message);
    }
    return e;
  };
  auto st = old->stopped_state(true);
  if (!st.ok()) return resume(st.error());
  auto snap = engine::carry_snapshot(from, st->snapshot, to, r.kept_boxes, r.input_from);
  if (!snap.ok()) return resume(snap.error());
  QueryRunner::State seed{{}, {}, std::move(*snap), st->journal_next, st->next_checkpoint_id};
  for (size_t i = 0; i < r.input_from.size(); ++i)
    seed.positions.push_back(r.input_from[i] ? st->positions[*r.input_from[i]] : r.meta.start[i]);
  r.meta.start = seed.positions;
  store::WriteBatch wb;
  std::vector<StreamPtr> created;
  for (size_t o = 0, c = 0; o < r.outs.size(); ++o) {
    seed.out_next.push_back(r.output_from[o] ? st->out_next[*r.output_from[o]] : 1);
    if (r.outs[o]) continue;
    StreamMeta sm = r.created.at(c++);
    sm.id.value = allocate_id();
    wb.put(store::Cf::catalog, node_stream_key(sm.name), stream_meta_to_json(sm));
    r.outs[o] = new_output_stream(std::move(sm));
    created.push_back(r.outs[o]);
  }
  for (const auto& d : r.dropped) wb.erase(store::Cf::catalog, node_stream_key(d));
  add_next_id(wb);
  auto runner = QueryRunner::create(r.meta, r.ins, r.outs, runner_env());
  if (!runner.ok()) return resume(runner.error());
  if (Status s = (*runner)->seed(seed, /*continue_journal=*/true); !s.ok()) return resume(s.error());
  (*runner)->add_checkpoint(wb);
  wb.put(store::Cf::catalog, node_query_key(name), query_meta_to_json(r.meta));
  if (Status s = store_->write(wb, store::Durability::synced); !s.ok()) return resume(s.error());
  for (const auto& s : created) streams_[s->meta().name] = s;
  for (const auto& d : r.dropped) {
    auto it = streams_.find(d);
    if (it == streams_.end()) continue;
    it->second->close();
    if (Status s = store::StreamLog::drop(*store_, it->second->meta().id); !s.ok())
      log_line(LogLevel::warn, "query", "dropping the log of '" + d + "', no longer written by query '" + name + "': " + s.error().message);
    streams_.erase(it);
  }
  queries_[name] = *runner;
  (*runner)->start();
  return *runner;
}
}  // namespace entente::broker::detail
