// Cutting a query network into fragments: validation of a placement and the
// fragments' own networks (engine/fragments.h, docs/query-networks.md,
// "Cutting a query into fragments").
#include "engine/fragments.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "base/json_read.h"
#include "engine/detail/network_def.h"
#include "engine/hash.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace entente::engine {

namespace {

using detail::NetworkDef;
using detail::Source;
using detail::Target;
using JsonValue = rapidjson::Value;

constexpr std::string_view kBase = "$.placement.fragments";
// Stream names as the broker accepts them (broker/detail/streams.h).
constexpr size_t kMaxStreamNameLength = 63;
// How much of the query name a hashed internal stream name keeps.
constexpr size_t kHashedPrefixLength = 40;

std::string frag_path(size_t i) { return std::string(kBase) + "[" + std::to_string(i) + "]"; }

// A user-supplied string for an error message, cut short so that a huge
// string cannot make a huge diagnostic (as in network validation).
std::string quote(std::string_view s) {
  constexpr size_t kShown = 64;
  std::string out = "'";
  out.append(s.substr(0, kShown));
  if (s.size() > kShown) out += "...";
  out += "'";
  return out;
}

bool lower_alnum_dash(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

// "--" separates the query from the fragment in generated network names;
// a fragment name without it keeps those names unique.
bool valid_fragment_name(std::string_view s) {
  return !s.empty() && s.size() <= kMaxFragmentNameLength && s[0] >= 'a' && s[0] <= 'z' && lower_alnum_dash(s) &&
         s.find("--") == std::string_view::npos;
}

// Node names as the broker's configuration accepts them.
bool valid_node_name(std::string_view s) {
  return !s.empty() && s.size() <= kMaxNodeNameLength && s[0] >= 'a' && s[0] <= 'z' && lower_alnum_dash(s);
}

std::string join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

Error summary(std::string_view query, const Diagnostics& diag, size_t first) {
  const size_t n = diag.size() - first;
  const auto& d = diag.items()[first];
  return make_error(Errc::invalid_argument, "placement of query '" + std::string(query) + "' is invalid: " +
                                                std::to_string(n) + (n == 1 ? " problem" : " problems") +
                                                "; first: " + d.path + ": " + d.message);
}

// Splits an arc end "id" or "id.N" (already validated by the network).
std::pair<std::string_view, size_t> split_end(std::string_view s) {
  const auto dot = s.find('.');
  if (dot == std::string_view::npos) return {s, 0};
  size_t port = 0;
  for (char c : s.substr(dot + 1)) port = port * 10 + size_t(c - '0');
  return {s.substr(0, dot), port};
}

std::string_view str_of(const JsonValue& v) { return {v.GetString(), v.GetStringLength()}; }

// Smallest disjoint-set forest, for a fragment's connectivity.
struct DisjointSets {
  std::vector<uint32_t> parent;
  explicit DisjointSets(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0u); }
  uint32_t find(uint32_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }
  void unite(uint32_t a, uint32_t b) { parent[find(a)] = find(b); }
};

using Writer = rapidjson::Writer<rapidjson::StringBuffer>;

void write_schema(Writer& w, const Schema& s) {
  w.StartArray();
  for (const Field& f : s.fields()) {
    w.StartObject();
    w.Key("name");
    w.String(f.name.data(), rapidjson::SizeType(f.name.size()));
    w.Key("type");
    const std::string_view t = type_name(f.type);
    w.String(t.data(), rapidjson::SizeType(t.size()));
    w.EndObject();
  }
  w.EndArray();
}

void write_string(Writer& w, std::string_view s) { w.String(s.data(), rapidjson::SizeType(s.size())); }

// What cut_query learned about the placement, once it is valid.
struct Placement {
  const NetworkDef& def;
  const std::vector<FragmentSpec>& specs;
  std::vector<int> owner;  // per box (topological index): fragment index
  std::unordered_map<std::string_view, uint32_t> box_index;  // id -> topological index
};

// The network of fragment `f`. `arc_of` maps (box, port) to an index into
// `arcs` for every port that other fragments read.
std::string fragment_json(const Placement& p, size_t f, const std::vector<InternalArc>& arcs,
                          const std::map<std::pair<uint32_t, size_t>, size_t>& arc_of, FragmentPlan& plan) {
  const NetworkDef& def = p.def;
  const JsonValue& doc = *def.doc;
  auto owned = [&](uint32_t box) { return p.owner[box] == int(f); };
  rapidjson::StringBuffer sb;
  Writer w(sb);
  w.StartObject();
  w.Key("name");
  write_string(w, fragment_network_name(def.name, p.specs[f].name));
  w.Key("description");
  write_string(w, "fragment " + p.specs[f].name + " of query " + def.name);

  w.Key("inputs");
  w.StartArray();
  // The query's own inputs that feed this fragment, unchanged: the
  // fragment reads the same stream (an input feeding several fragments is
  // read by each).
  for (size_t i = 0; i < def.inputs.size(); ++i) {
    const auto& ts = def.input_targets[i];
    if (!std::any_of(ts.begin(), ts.end(), [&](const Target& t) { return owned(t.index); })) continue;
    doc["inputs"][rapidjson::SizeType(i)].Accept(w);
    plan.inputs.push_back(def.inputs[i].name);
  }
  // One input per internal stream read. Its rows arrive with the event
  // times the producing box gave them (no "event_time" field: the caller's
  // Batch::event_time is used as is), and its watermark is "manual": the
  // producer's output watermark (Executor::output_watermark) is carried
  // across with the rows and set here with advance_watermark, so that the
  // consuming boxes see the same watermarks as in the whole network, not
  // one recomputed from the rows (which may lag or lead it).
  for (const InternalArc& a : arcs) {
    if (std::find(a.to_fragments.begin(), a.to_fragments.end(), p.specs[f].name) == a.to_fragments.end()) continue;
    w.StartObject();
    w.Key("name");
    write_string(w, a.stream);
    w.Key("schema");
    write_schema(w, *a.schema);
    w.Key("watermarks");
    w.String("manual");
    w.EndObject();
    plan.reads.push_back(a.stream);
  }
  w.EndArray();

  // The fragment's boxes, unchanged, in document order.
  std::vector<const detail::BoxDef*> boxes;
  for (size_t b = 0; b < def.boxes.size(); ++b)
    if (owned(uint32_t(b))) boxes.push_back(&def.boxes[b]);
  std::sort(boxes.begin(), boxes.end(), [](auto* x, auto* y) { return x->json_index < y->json_index; });
  w.Key("boxes");
  w.StartArray();
  for (const auto* b : boxes) doc["boxes"][rapidjson::SizeType(b->json_index)].Accept(w);
  w.EndArray();

  // The arcs into its boxes, in document order (which fixes the order of
  // delivery among the targets of one port), those from another fragment's
  // box now from the internal stream.
  w.Key("arcs");
  w.StartArray();
  for (const JsonValue& arc : doc["arcs"].GetArray()) {
    const auto to = split_end(str_of(arc["to"])).first;
    if (!owned(p.box_index.at(to))) continue;
    const std::string_view from = str_of(arc["from"]);
    const auto [from_id, from_port] = split_end(from);
    w.StartObject();
    w.Key("from");
    auto fb = p.box_index.find(from_id);
    if (fb != p.box_index.end() && !owned(fb->second)) write_string(w, arcs[arc_of.at({fb->second, from_port})].stream);
    else write_string(w, from);
    w.Key("to");
    arc["to"].Accept(w);
    w.EndObject();
  }
  w.EndArray();

  w.Key("outputs");
  w.StartArray();
  const JsonValue& outs = doc["outputs"];
  for (size_t o = 0; o < def.outputs.size(); ++o) {
    const auto from_id = split_end(str_of(outs[rapidjson::SizeType(o)]["from"])).first;
    if (!owned(p.box_index.at(from_id))) continue;
    outs[rapidjson::SizeType(o)].Accept(w);
    plan.outputs.push_back(def.outputs[o].name);
  }
  for (const InternalArc& a : arcs) {
    if (a.from_fragment != p.specs[f].name) continue;
    w.StartObject();
    w.Key("name");
    write_string(w, a.stream);
    w.Key("from");
    write_string(w, a.from);
    w.EndObject();
    plan.writes.push_back(a.stream);
  }
  w.EndArray();
  w.EndObject();
  return {sb.GetString(), sb.GetSize()};
}

// Reports every cycle between fragments, one per strongly connected group
// of fragments, at the group's first fragment in placement order.
void report_cycles(const std::vector<FragmentSpec>& specs, const std::vector<std::vector<bool>>& edge,
                   Diagnostics& diag) {
  const size_t n = specs.size();
  // reach[i][j]: a path of at least one arc from i to j (n <= 64).
  std::vector<std::vector<bool>> reach = edge;
  for (size_t k = 0; k < n; ++k)
    for (size_t i = 0; i < n; ++i)
      if (reach[i][k])
        for (size_t j = 0; j < n; ++j)
          if (reach[k][j]) reach[i][j] = true;
  std::vector<bool> done(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (done[i] || !reach[i][i]) continue;
    std::vector<bool> in_group(n, false);
    for (size_t j = 0; j < n; ++j)
      if (j == i || (reach[i][j] && reach[j][i])) in_group[j] = done[j] = true;
    // The shortest cycle through i, by breadth-first search within the group.
    std::vector<int> parent(n, -1);
    std::vector<size_t> queue{i};
    int last = -1;
    for (size_t q = 0; q < queue.size() && last < 0; ++q) {
      const size_t u = queue[q];
      if (edge[u][i]) {
        last = int(u);
        break;
      }
      for (size_t v = 0; v < n; ++v)
        if (edge[u][v] && in_group[v] && v != i && parent[v] < 0) {
          parent[v] = int(u);
          queue.push_back(v);
        }
    }
    std::vector<std::string> names;
    for (int u = last; u >= 0 && size_t(u) != i; u = parent[size_t(u)]) names.push_back(specs[size_t(u)].name);
    names.push_back(specs[i].name);
    std::reverse(names.begin(), names.end());
    names.push_back(specs[i].name);
    diag.error(frag_path(i), "cycle between fragments: " + join(names, " -> ") +
                                 "; each fragment must only read from fragments before it");
  }
}

using EdgeMatrix = std::vector<std::vector<bool>>;  // [producer][consumer] fragment

std::string fragment_of(const std::vector<FragmentSpec>& specs, std::string_view name) {
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name == name) return frag_path(i);
  return std::string(kBase);
}

// Fragment names (valid, unique, short enough for the generated network
// name) and node names.
void check_names(const NetworkDef& def, const std::vector<FragmentSpec>& specs, Diagnostics& diag) {
  std::map<std::string_view, size_t> by_name;
  for (size_t i = 0; i < specs.size(); ++i) {
    const FragmentSpec& s = specs[i];
    const std::string path = frag_path(i);
    if (!valid_fragment_name(s.name)) {
      diag.error(path + ".name", "bad fragment name " + quote(s.name) +
                                     ": expected [a-z][a-z0-9-]* without '--', at most " +
                                     std::to_string(kMaxFragmentNameLength) + " characters");
    } else if (auto [it, fresh] = by_name.emplace(s.name, i); !fresh) {
      diag.error(path + ".name", "duplicate fragment name " + quote(s.name) + ": already used by " +
                                     frag_path(it->second));
    } else if (const auto full = fragment_network_name(def.name, s.name); full.size() > detail::kMaxNameLength) {
      diag.error(path + ".name", "the fragment's network name '" + full + "' would be " +
                                     std::to_string(full.size()) + " characters; the limit is " +
                                     std::to_string(detail::kMaxNameLength) +
                                     ": shorten the query's or the fragment's name");
    }
    if (!s.node.empty() && !valid_node_name(s.node))
      diag.error(path + ".node", "bad node name " + quote(s.node) + ": expected [a-z][a-z0-9-]*, at most " +
                                     std::to_string(kMaxNodeNameLength) + " characters");
  }
}

// Every box in exactly one fragment: fills p.owner (first claim wins).
// Returns, per fragment, whether its box list had a problem; such a
// fragment is not checked for connectivity: its list is not what was meant.
std::vector<bool> assign_boxes(Placement& p, Diagnostics& diag) {
  const auto& specs = p.specs;
  std::vector<bool> box_problem(specs.size(), false);
  std::vector<std::string> claimed_at(p.def.boxes.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string path = frag_path(i);
    if (specs[i].boxes.empty()) {
      diag.error(path + ".boxes", "fragment " + quote(specs[i].name) + " has no boxes");
      continue;
    }
    for (size_t j = 0; j < specs[i].boxes.size(); ++j) {
      const std::string& id = specs[i].boxes[j];
      const std::string box_path = path + ".boxes[" + std::to_string(j) + "]";
      auto it = p.box_index.find(id);
      if (it == p.box_index.end()) {
        diag.error(box_path, "no box " + quote(id) + " in the network");
        box_problem[i] = true;
      } else if (const int o = p.owner[it->second]; o >= 0) {
        diag.error(box_path, "box " + quote(id) + " is already in fragment " + quote(specs[size_t(o)].name) +
                                 " (" + claimed_at[it->second] + ")");
        box_problem[i] = true;
      } else {
        p.owner[it->second] = int(i);
        claimed_at[it->second] = box_path;
      }
    }
  }
  std::vector<const detail::BoxDef*> missing;
  for (size_t b = 0; b < p.def.boxes.size(); ++b)
    if (p.owner[b] < 0) missing.push_back(&p.def.boxes[b]);
  std::sort(missing.begin(), missing.end(), [](auto* x, auto* y) { return x->json_index < y->json_index; });
  for (const auto* b : missing) diag.error(std::string(kBase), "box " + quote(b->id) + " is in no fragment");
  return box_problem;
}

// Reports each fragment whose boxes are not connected by the arcs between
// them (ignoring their direction). Returns the arcs between fragments.
EdgeMatrix check_connected(const Placement& p, const std::vector<bool>& box_problem, bool connected,
                           Diagnostics& diag) {
  const auto& specs = p.specs;
  const size_t n = specs.size();
  DisjointSets sets(p.def.boxes.size());
  EdgeMatrix edge(n, std::vector<bool>(n, false));
  for (size_t b = 0; b < p.def.boxes.size(); ++b) {
    for (const Source& s : p.def.boxes[b].sources) {
      if (s.kind != Source::Kind::box || p.owner[b] < 0 || p.owner[s.index] < 0) continue;
      if (p.owner[s.index] == p.owner[b]) sets.unite(uint32_t(b), s.index);
      else edge[size_t(p.owner[s.index])][size_t(p.owner[b])] = true;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (box_problem[i] || specs[i].boxes.empty()) continue;
    std::vector<uint32_t> roots;  // in order of first appearance
    std::map<uint32_t, std::vector<std::string>> groups;
    for (const std::string& id : specs[i].boxes) {
      const uint32_t root = sets.find(p.box_index.at(id));
      if (!groups.count(root)) roots.push_back(root);
      groups[root].push_back(id);
    }
    if (roots.size() < 2 || !connected) continue;
    std::string msg = "fragment " + quote(specs[i].name) + " is not connected: its boxes form " +
                      std::to_string(roots.size()) + " groups with no arc between them:";
    for (size_t g = 0; g < roots.size(); ++g) msg += (g ? ", [" : " [") + join(groups[roots[g]], ", ") + "]";
    diag.error(frag_path(i) + ".boxes", msg);
  }
  return edge;
}

// One internal arc per box output port read by other fragments, by box
// (topological) then port; `arc_of` maps (box, port) to its index.
std::vector<InternalArc> make_arcs(const Placement& p, std::map<std::pair<uint32_t, size_t>, size_t>& arc_of) {
  std::vector<InternalArc> arcs;
  for (size_t b = 0; b < p.def.boxes.size(); ++b) {
    const detail::BoxDef& bd = p.def.boxes[b];
    for (size_t port = 0; port < bd.targets.size(); ++port) {
      std::set<size_t> readers;
      for (const Target& t : bd.targets[port])
        if (t.kind == Target::Kind::box && p.owner[t.index] != p.owner[b]) readers.insert(size_t(p.owner[t.index]));
      if (readers.empty()) continue;
      InternalArc a;
      a.stream = internal_stream_name(p.def.name, bd.id, port);
      a.from_fragment = p.specs[size_t(p.owner[b])].name;
      a.from = bd.id + "." + std::to_string(port);
      for (size_t r : readers) a.to_fragments.push_back(p.specs[r].name);
      a.schema = bd.output_schemas[port];
      arc_of[{uint32_t(b), port}] = arcs.size();
      arcs.push_back(std::move(a));
    }
  }
  return arcs;
}

// An internal stream becomes an input (sharing the namespace of inputs and
// boxes) and an output of fragment networks: its name must not be any name
// of the query, nor another internal stream's (only a hashed name, or a
// query that itself uses "--" in its names, can clash).
void check_stream_names(const Placement& p, const std::vector<InternalArc>& arcs, Diagnostics& diag) {
  std::map<std::string_view, std::string> taken;
  for (const auto& in : p.def.inputs) taken.emplace(in.name, "input");
  for (const auto& b : p.def.boxes) taken.emplace(b.id, "box");
  for (const auto& o : p.def.outputs) taken.emplace(o.name, "output");
  std::map<std::string_view, std::string_view> streams;
  for (const InternalArc& a : arcs) {
    const std::string path = fragment_of(p.specs, a.from_fragment);
    if (auto t = taken.find(a.stream); t != taken.end()) {
      diag.error(path, "the internal stream for " + a.from + " would be named '" + a.stream + "', as " + t->second +
                           " " + quote(a.stream) + " of the query is; rename that " + t->second);
    } else if (auto [s, fresh] = streams.emplace(a.stream, a.from); !fresh) {
      diag.error(path, "the internal streams for " + std::string(s->second) + " and " + a.from +
                           " would both be named '" + a.stream + "'; rename one of the boxes");
    }
  }
}

// A fragment's network has the limits of any network: a fragment of many
// boxes reading (or feeding) many others could pass them.
void check_stream_counts(const Placement& p, const std::vector<InternalArc>& arcs, Diagnostics& diag) {
  const NetworkDef& def = p.def;
  for (size_t i = 0; i < p.specs.size(); ++i) {
    const std::string& name = p.specs[i].name;
    size_t reads = 0, writes = 0;
    for (const auto& ts : def.input_targets)
      if (std::any_of(ts.begin(), ts.end(), [&](const Target& t) { return p.owner[t.index] == int(i); })) ++reads;
    for (const auto& o : def.outputs)
      if (p.owner[p.box_index.at(split_end(o.from).first)] == int(i)) ++writes;
    for (const InternalArc& a : arcs) {
      if (std::find(a.to_fragments.begin(), a.to_fragments.end(), name) != a.to_fragments.end()) ++reads;
      if (a.from_fragment == name) ++writes;
    }
    if (reads > detail::kMaxInputs)
      diag.error(frag_path(i), "fragment " + quote(name) + " would read " + std::to_string(reads) +
                                   " streams (query inputs and internal streams); a network has at most " +
                                   std::to_string(detail::kMaxInputs) + " inputs: put more of its upstream boxes in it");
    if (writes > detail::kMaxOutputs)
      diag.error(frag_path(i), "fragment " + quote(name) + " would write " + std::to_string(writes) +
                                   " streams (query outputs and internal streams); a network has at most " +
                                   std::to_string(detail::kMaxOutputs) +
                                   " outputs: put more of its downstream boxes in it");
  }
}

// Kahn's algorithm, lowest placement index first. REQUIRES: acyclic.
std::vector<size_t> pipeline_order(const EdgeMatrix& edge) {
  const size_t n = edge.size();
  std::vector<size_t> indegree(n, 0), order;
  for (size_t a = 0; a < n; ++a)
    for (size_t b = 0; b < n; ++b)
      if (edge[a][b]) ++indegree[b];
  std::set<size_t> ready;
  for (size_t i = 0; i < n; ++i)
    if (indegree[i] == 0) ready.insert(i);
  while (!ready.empty()) {
    const size_t u = *ready.begin();
    ready.erase(ready.begin());
    order.push_back(u);
    for (size_t v = 0; v < n; ++v)
      if (edge[u][v] && --indegree[v] == 0) ready.insert(v);
  }
  return order;
}

}  // namespace

std::string fragment_network_name(std::string_view query, std::string_view fragment) {
  return std::string(query) + "--" + std::string(fragment);
}

std::string internal_stream_name(std::string_view query, std::string_view box, size_t port) {
  const bool plain_box = !box.empty() && box.find("--") == std::string_view::npos &&
                         std::all_of(box.begin(), box.end(), [](char c) {
                           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
                         });
  std::string plain = std::string(query) + "--" + std::string(box) + "_" + std::to_string(port);
  if (plain_box && plain.size() <= kMaxStreamNameLength) return plain;
  // hash_bytes is fixed across versions and machines (engine/hash.h), so
  // the name is too.
  const uint64_t h = hash_bytes(std::string(query) + '\n' + std::string(box) + '\n' + std::to_string(port));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string(query.substr(0, kHashedPrefixLength)) + "--" + hex;
}

SchemaPtr internal_stream_schema(const Schema& port) {
  std::vector<Field> fields = port.fields();
  auto free_name = [&](std::string base) {
    std::string name = base;
    for (int i = 1; port.index_of(name); ++i) name = base + "_" + std::to_string(i);
    return name;
  };
  fields.push_back({free_name("_wm"), Type::Int64});
  fields.push_back({free_name("_wm_only"), Type::Bool});
  return make_schema(std::move(fields));
}

Batch internal_rows(const SchemaPtr& internal, const Batch& batch, EventTime wm) {
  Batch out(internal);
  out.columns = batch.columns;
  auto wms = std::make_shared<Column>(Type::Int64);
  wms->ints.assign(batch.rows(), wm);
  auto only = std::make_shared<Column>(Type::Bool);
  only->bools.assign(batch.rows(), 0);
  out.columns.push_back(std::move(wms));
  out.columns.push_back(std::move(only));
  out.event_time = batch.event_time;
  out.seq = batch.seq;
  return out;
}

Batch internal_mark(const SchemaPtr& internal, EventTime wm) {
  BatchBuilder b(internal);
  const size_t n = internal->size();
  for (size_t i = 0; i + 2 < n; ++i) {
    Column& c = b.column(i);
    switch (c.type) {
      case Type::Int64:
      case Type::Timestamp: c.ints.push_back(0); break;
      case Type::Double: c.doubles.push_back(0); break;
      case Type::Bool: c.bools.push_back(0); break;
      case Type::String: c.append_str(""); break;
    }
  }
  b.column(n - 2).ints.push_back(wm);
  b.column(n - 1).bools.push_back(1);
  b.event_time().push_back(wm);
  b.seq().push_back(0);
  return b.finish();
}

void push_internal(Executor& exec, size_t input, const SchemaPtr& port, const Batch& internal) {
  const size_t n = port->size();
  if (internal.columns.size() != n + 2 || internal.schema->size() != n + 2 ||
      internal.column(n).type != Type::Int64 || internal.column(n + 1).type != Type::Bool)
    throw std::invalid_argument("push_internal: not a batch of the internal stream of schema " + port->to_string());
  const auto& wm = internal.column(n).ints;
  const auto& only = internal.column(n + 1).bools;
  const std::vector<ColumnPtr> data(internal.columns.begin(), internal.columns.begin() + static_cast<long>(n));
  const Batch rows = internal.project(port, data);
  const size_t total = internal.rows();
  size_t i = 0;
  while (i < total) {
    exec.advance_watermark(input, wm[i]);
    if (only[i]) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < total && !only[j] && wm[j] == wm[i]) ++j;
    if (i == 0 && j == total) {
      exec.push(input, rows);
    } else {
      std::vector<uint32_t> idx(j - i);
      std::iota(idx.begin(), idx.end(), static_cast<uint32_t>(i));
      exec.push(input, rows.take(idx));
    }
    i = j;
  }
}

std::vector<FragmentSpec> whole_query_fragment(const QueryNetwork& net, std::string name, std::string node) {
  FragmentSpec s{std::move(name), std::move(node), {}};
  std::vector<const detail::BoxDef*> boxes;
  for (const auto& b : net.def()->boxes) boxes.push_back(&b);
  std::sort(boxes.begin(), boxes.end(), [](auto* x, auto* y) { return x->json_index < y->json_index; });
  for (const auto* b : boxes) s.boxes.push_back(b->id);
  return {std::move(s)};
}

Result<std::vector<FragmentSpec>> read_fragment_specs(const rapidjson::Value& fragments, Diagnostics& diag) {
  const size_t first = diag.size();
  const std::string base(kBase);
  auto fail = [&] {
    const auto& d = diag.items()[first];
    const size_t n = diag.size() - first;
    return make_error(Errc::invalid_argument, "placement is invalid: " + std::to_string(n) +
                                                  (n == 1 ? " problem" : " problems") + "; first: " + d.path +
                                                  ": " + d.message);
  };
  if (!fragments.IsArray()) {
    diag.error(base, "expected an array of fragments, got " + std::string(base::json_kind(fragments)));
    return fail();
  }
  if (fragments.Size() > kMaxFragments) {
    diag.error(base, "too many fragments: " + std::to_string(fragments.Size()) + "; the limit is " +
                         std::to_string(kMaxFragments));
    return fail();
  }
  std::vector<FragmentSpec> specs(fragments.Size());
  for (rapidjson::SizeType i = 0; i < fragments.Size(); ++i) {
    if (!fragments[i].IsObject()) {
      diag.error(frag_path(i), "expected a fragment {\"name\", \"node\", \"boxes\"}, got " +
                                   std::string(base::json_kind(fragments[i])));
      continue;
    }
    base::JsonObjectReader r(&fragments[i], frag_path(i), diag, base::kFieldWords);
    if (auto name = r.string("name", base::Need::required)) specs[i].name = std::move(*name);
    if (auto node = r.string("node", base::Need::optional)) specs[i].node = std::move(*node);
    const JsonValue* boxes = r.has("boxes") ? r.value("boxes", base::Need::required) : nullptr;
    if (boxes != nullptr && boxes->IsArray() && boxes->Size() > detail::kMaxBoxes) {
      diag.error(r.path_of("boxes"), "too many boxes: " + std::to_string(boxes->Size()) +
                                         "; a network has at most " + std::to_string(detail::kMaxBoxes));
    } else if (auto ids = r.strings("boxes", base::Need::required)) {
      specs[i].boxes = std::move(*ids);
    }
    r.finish();
  }
  if (diag.size() != first) return fail();
  return specs;
}

Result<std::vector<FragmentSpec>> read_fragment_specs(std::string_view query_document, Diagnostics& diag) {
  rapidjson::Document doc;
  if (auto problem = base::read_json(query_document, doc)) {
    diag.error(problem->path, problem->why);
    return problem->error();
  }
  const JsonValue* placement = doc.IsObject() && doc.HasMember("placement") ? &doc["placement"] : nullptr;
  if (placement != nullptr && !placement->IsObject()) {
    diag.error("$.placement", "expected an object, got " + std::string(base::json_kind(*placement)));
    return make_error(Errc::invalid_argument, "$.placement: expected an object, got " +
                                                  std::string(base::json_kind(*placement)));
  }
  if (placement == nullptr || !placement->HasMember("fragments")) {
    diag.error(std::string(kBase), "missing required field 'fragments'");
    return make_error(Errc::invalid_argument, std::string(kBase) + ": missing required field 'fragments'");
  }
  return read_fragment_specs((*placement)["fragments"], diag);
}

Result<QueryCut> cut_query(const QueryNetwork& net, const std::vector<FragmentSpec>& specs, Diagnostics& diag,
                           bool connected) {
  if (net.def() == nullptr) return make_error(Errc::invalid_argument, "cut_query: empty query network");
  const NetworkDef& def = *net.def();
  const size_t first = diag.size();
  const size_t n = specs.size();
  if (n == 0) diag.error(std::string(kBase), "a placement needs at least one fragment");
  if (n > kMaxFragments) {
    diag.error(std::string(kBase),
               "too many fragments: " + std::to_string(n) + "; the limit is " + std::to_string(kMaxFragments));
    return summary(def.name, diag, first);
  }
  Placement p{def, specs, std::vector<int>(def.boxes.size(), -1), {}};
  for (size_t b = 0; b < def.boxes.size(); ++b) p.box_index.emplace(def.boxes[b].id, uint32_t(b));

  // The placement itself; the fragments must form a pipeline.
  check_names(def, specs, diag);
  const std::vector<bool> box_problem = assign_boxes(p, diag);
  const EdgeMatrix edge = check_connected(p, box_problem, connected, diag);
  report_cycles(specs, edge, diag);
  if (diag.size() != first) return summary(def.name, diag, first);

  // What the cut generates.
  QueryCut cut;
  std::map<std::pair<uint32_t, size_t>, size_t> arc_of;
  cut.arcs = make_arcs(p, arc_of);
  check_stream_names(p, cut.arcs, diag);
  check_stream_counts(p, cut.arcs, diag);
  if (diag.size() != first) return summary(def.name, diag, first);
  for (size_t i = 0; i < n; ++i) {
    FragmentPlan plan;
    plan.name = specs[i].name;
    plan.node = specs[i].node;
    plan.network_json = fragment_json(p, i, cut.arcs, arc_of, plan);
    // Every rule that could make it fail was checked above, short of the
    // 4 MiB document limit (internal inputs add their schemas); if it
    // fails anyway, say so rather than hand on a network no node can run.
    Diagnostics inner;
    auto parsed = QueryNetwork::parse(plan.network_json, inner);
    if (!parsed.ok()) {
      diag.error(frag_path(i), "the network generated for fragment " + quote(plan.name) +
                                   " does not validate: " + parsed.error().message);
      return summary(def.name, diag, first);
    }
    plan.network = std::move(parsed).value();
    cut.fragments.push_back(std::move(plan));
  }
  cut.pipeline_order = pipeline_order(edge);
  return cut;
}

}  // namespace entente::engine
