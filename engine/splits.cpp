// Splitting a fragment by key groups: the checks, the rewrite of the query
// network and placement, and the carrying of a snapshot to the parts
// (engine/splits.h, docs/cluster.md "Splitting a fragment").
#include "engine/splits.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "engine/detail/network_def.h"
#include "engine/detail/network_runtime.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace entente::engine {

namespace {

using detail::BoxDef;
using detail::NetworkDef;
using detail::Source;
using detail::Target;

constexpr size_t kMaxBoxIdLength = 64;

std::string quote(std::string_view s) {
  std::string out = "'";
  out.append(s.substr(0, 64));
  if (s.size() > 64) out += "...";
  return out + "'";
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

bool valid_node_name(std::string_view s) {
  return !s.empty() && s.size() <= kMaxNodeNameLength && s[0] >= 'a' && s[0] <= 'z' &&
         std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

// "box" or "box.port" (ids have no '.').
std::pair<std::string, uint32_t> split_end(std::string_view s) {
  const auto dot = s.rfind('.');
  if (dot == std::string_view::npos) return {std::string(s), 0};
  return {std::string(s.substr(0, dot)), static_cast<uint32_t>(std::stoul(std::string(s.substr(dot + 1))))};
}

std::string end_of(const std::string& id, uint32_t port) {
  return port == 0 ? id : id + "." + std::to_string(port);
}

rapidjson::Value str_value(std::string_view s, rapidjson::Document::AllocatorType& a) {
  return rapidjson::Value(s.data(), static_cast<rapidjson::SizeType>(s.size()), a);
}

Error summary(std::string_view fragment, const Diagnostics& diag, size_t first) {
  const size_t n = diag.size() - first;
  const auto& d = diag.items()[first];
  return make_error(Errc::invalid_argument, "fragment '" + std::string(fragment).substr(0, 64) +
                                                "' cannot be split: " + std::to_string(n) +
                                                (n == 1 ? " problem" : " problems") + "; first: " + d.path + ": " +
                                                d.message);
}

// The parts: 2 to 16, valid nodes, ranges that follow each other from key
// group 0 to kKeyGroups.
void check_parts(const std::vector<SplitPartSpec>& parts, Diagnostics& diag) {
  if (parts.size() < kMinSplitParts || parts.size() > kMaxSplitParts) {
    diag.error("$.parts", "a split has " + std::to_string(kMinSplitParts) + " to " + std::to_string(kMaxSplitParts) +
                              " parts, not " + std::to_string(parts.size()));
    return;
  }
  uint32_t next = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string at = "$.parts[" + std::to_string(i) + "]";
    if (!valid_node_name(parts[i].node))
      diag.error(at + ".node", "bad node name " + quote(parts[i].node) + ": expected [a-z][a-z0-9-]*, at most " +
                                   std::to_string(kMaxNodeNameLength) + " characters");
    const KeyGroupRange r = parts[i].range;
    const std::string shown = "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
    if (r.end > kKeyGroups || r.begin >= r.end) {
      diag.error(at + ".range", "key-group range " + shown + " is empty or leaves [0, " + std::to_string(kKeyGroups) +
                                    ")");
      return;
    }
    if (r.begin < next) {
      diag.error(at + ".range", "key-group range " + shown + " overlaps the part before it, which ends at " +
                                    std::to_string(next));
      return;
    }
    if (r.begin > next) {
      diag.error(at + ".range", "key-group range " + shown + " leaves key groups [" + std::to_string(next) + ", " +
                                    std::to_string(r.begin) + ") to no part (the parts' ranges must follow each "
                                    "other from 0 to " + std::to_string(kKeyGroups) + ")");
      return;
    }
    next = r.end;
  }
  if (next != kKeyGroups)
    diag.error("$.parts[" + std::to_string(parts.size() - 1) + "].range",
               "the last range ends at key group " + std::to_string(next) + ": key groups [" + std::to_string(next) +
                   ", " + std::to_string(kKeyGroups) + ") are left to no part");
}

// What the split needs to know of the fragment's boxes.
struct Shape {
  int keyed = -1;                      // topological index of the keyed box
  bool join = false;                   // it is a join (else an aggregate)
  std::vector<uint32_t> boxes;         // the fragment's boxes (topological)
  // (box, input port) fed from outside: one; a join's, one per side, in
  // side order.
  std::vector<std::pair<uint32_t, uint32_t>> entries;
  std::vector<std::vector<std::string>> entry_keys;  // the keys each entry's router hashes
  std::pair<uint32_t, uint32_t> exit;  // (box, output port) read outside
  // The keyed aggregate's `top`, if any: each part keeps its own best
  // groups of a window, and the merge ranks them again all together.
  const rapidjson::Value* top = nullptr;
};

// The field the keyed aggregate's `top` ranks by, if it has one.
std::optional<std::string> shape_top_by(const Shape& s) {
  if (s.top == nullptr || !s.top->IsObject() || !s.top->HasMember("by") || !(*s.top)["by"].IsString())
    return std::nullopt;
  return std::string((*s.top)["by"].GetString());
}

// True if map options `o` give field `key` as it came (`"expr": key`).
bool hands_on(const rapidjson::Value& o, const std::string& key) {
  if (!o.HasMember("fields") || !o["fields"].IsArray()) return false;
  for (const auto& f : o["fields"].GetArray())
    if (f.IsObject() && f.HasMember("name") && f["name"].IsString() && f["name"].GetString() == key &&
        f.HasMember("expr") && f["expr"].IsString())
      return trimmed(f["expr"].GetString()) == key;
  return false;
}

// Checks that a fragment can be split by its keyed box's key (the reasons
// in splits.h), step by step; every problem goes to `diag`.
class ShapeCheck {
 public:
  ShapeCheck(const NetworkDef& def, const std::set<std::string>& ids, Diagnostics& diag)
      : def_(def), diag_(diag), in_(def.boxes.size(), false), side_(def.boxes.size(), -1) {
    for (uint32_t b = 0; b < def.boxes.size(); ++b)
      if (ids.count(def.boxes[b].id)) {
        in_[b] = true;
        s_.boxes.push_back(b);
      }
  }

  Shape run() {
    find_keyed();
    if (diag_.size() > 0 || s_.keyed < 0) return s_;
    find_sides();
    if (diag_.size() > 0) return s_;
    find_entries_and_exit();
    if (diag_.size() > 0) return s_;
    check_around_keyed();
    return s_;
  }

 private:
  std::string path(uint32_t b) const { return def_.boxes[b].path(); }
  std::string name(uint32_t b) const { return quote(def_.boxes[b].id) + " (" + def_.boxes[b].type + ")"; }
  uint32_t keyed() const { return static_cast<uint32_t>(s_.keyed); }
  void two_keyed(uint32_t b) {
    diag_.error(path(b), "the fragment has two keyed boxes, " + quote(def_.boxes[keyed()].id) + " and " +
                             quote(def_.boxes[b].id) + ": a split routes by one key");
  }

  // The keyed box (one aggregate grouped by a key, or a join), and boxes
  // whose state is not partitioned by key.
  void find_keyed() {
    for (uint32_t b : s_.boxes) {
      const BoxDef& box = def_.boxes[b];
      if (box.type == "filter" || box.type == "map") continue;
      if (box.type == "join") {
        if (s_.keyed >= 0) {
          two_keyed(b);
        } else {
          s_.keyed = int(b);
          s_.join = true;
        }
        continue;
      }
      if (box.type != "aggregate") {
        diag_.error(path(b), "box " + name(b) + " keeps state that is not partitioned by key group, so the "
                                                "fragment's state is not keyed");
        continue;
      }
      const rapidjson::Value& o = *box.options;
      if (!(o.HasMember("group_by") && o["group_by"].IsArray() && !o["group_by"].Empty())) {
        diag_.error(path(b) + ".options.group_by",
                    "aggregate " + quote(box.id) + " has no group_by: its state is one global group, not keyed");
      } else if (o.HasMember("timeout")) {
        diag_.error(path(b) + ".options.timeout", "aggregate " + quote(box.id) + " has a time-out: what it emits "
                                                  "depends on processing time, so parts would not emit the same "
                                                  "rows");
      } else if (o.HasMember("window") && o["window"].IsObject() && o["window"].HasMember("by") &&
                 o["window"]["by"].IsString() && std::string_view(o["window"]["by"].GetString()) == "count") {
        diag_.error(path(b) + ".options.window.by", "aggregate " + quote(box.id) + " has count windows, which "
                                                    "emit in arrival order: merged parts would order its rows "
                                                    "differently");
      } else if (s_.keyed >= 0) {
        two_keyed(b);
      } else {
        s_.keyed = int(b);
        if (o.HasMember("top")) s_.top = &o["top"];
      }
    }
    if (diag_.size() > 0 || s_.keyed >= 0) return;
    std::string which;
    for (uint32_t b : s_.boxes) which += (which.empty() ? "" : ", ") + name(b);
    diag_.error("$.boxes", "the fragment's state is not keyed: none of its boxes (" + which + ") keeps state by "
                           "key group; only a fragment with an aggregate grouped by a key is split");
  }

  // The side of the keyed box each box before it feeds (an aggregate has
  // one, side 0), walked from the keyed box upstream; the keys each side's
  // router hashes.
  void find_sides() {
    const BoxDef& k = def_.boxes[keyed()];
    for (uint32_t p = 0; p < k.sources.size(); ++p)
      if (const Source& src = k.sources[p]; src.kind == Source::Kind::box && in_[src.index]) side_[src.index] = int(p);
    for (auto it = s_.boxes.rbegin(); it != s_.boxes.rend(); ++it) {
      if (*it == keyed() || side_[*it] < 0) continue;
      for (const Source& src : def_.boxes[*it].sources) {
        if (src.kind != Source::Kind::box || !in_[src.index]) continue;
        if (side_[src.index] >= 0 && side_[src.index] != side_[*it])
          diag_.error(path(src.index), "box " + name(src.index) + " feeds both sides of the join " + quote(k.id) +
                                           ": each side's router hashes its own keys");
        side_[src.index] = side_[*it];
      }
    }
    const rapidjson::Value& o = *k.options;
    for (const char* name : s_.join ? std::vector<const char*>{"left_keys", "right_keys"}
                                    : std::vector<const char*>{"group_by"}) {
      std::vector<std::string> keys;
      if (o.HasMember(name) && o[name].IsArray())
        for (const auto& v : o[name].GetArray())
          if (v.IsString()) keys.emplace_back(v.GetString());
      keys_of_side_.push_back(std::move(keys));
    }
  }

  // Where rows enter the fragment (one place per side of the keyed box)
  // and the one port whose rows leave it.
  void find_entries_and_exit() {
    int exits = 0;
    std::vector<int> entry_of_side(keys_of_side_.size(), -1);
    for (uint32_t b : s_.boxes) {
      for (uint32_t p = 0; p < def_.boxes[b].sources.size(); ++p) {
        const Source& src = def_.boxes[b].sources[p];
        if (src.kind == Source::Kind::box && in_[src.index]) continue;
        const int at = b == keyed() ? int(p) : side_[b];
        if (at < 0) {
          diag_.error(path(b), "rows enter the fragment at box " + name(b) + ", after the keyed box " +
                                   quote(def_.boxes[keyed()].id));
          continue;
        }
        if (entry_of_side[size_t(at)] >= 0)
          diag_.error(path(b), "box " + name(b) + " is a second place where rows enter the fragment" +
                                   (s_.join ? " on side " + std::to_string(at) + " of the join" : std::string()) +
                                   ": a split has one router per input of its keyed box");
        else
          entry_of_side[size_t(at)] = int(s_.entries.size());
        s_.entries.emplace_back(b, p);
        s_.entry_keys.push_back(keys_of_side_[size_t(at)]);
      }
      for (uint32_t p = 0; p < def_.boxes[b].targets.size(); ++p) {
        const auto& ts = def_.boxes[b].targets[p];
        if (!std::any_of(ts.begin(), ts.end(),
                         [&](const Target& t) { return t.kind == Target::Kind::output || !in_[t.index]; }))
          continue;
        if (std::any_of(ts.begin(), ts.end(),
                        [&](const Target& t) { return t.kind == Target::Kind::box && in_[t.index]; }))
          diag_.error(path(b), "port " + std::to_string(p) + " of box " + name(b) + " feeds boxes both inside and "
                                                                                     "outside the fragment");
        if (exits++ == 0) s_.exit = {b, p};
        else
          diag_.error(path(b), "port " + std::to_string(p) + " of box " + name(b) + " is a second port whose rows "
                                                                                     "leave the fragment: a split "
                                                                                     "has one merge, for one port");
      }
    }
    for (size_t k = 0; k < entry_of_side.size(); ++k)
      if (entry_of_side[k] < 0)
        diag_.error(path(keyed()), "no rows enter the fragment on side " + std::to_string(k) + " of " +
                                       name(keyed()) + " from outside it: a split routes each side's input");
    // A join's entries in side order.
    if (diag_.size() == 0 && s_.join && entry_of_side[0] != 0) {
      std::swap(s_.entries[0], s_.entries[1]);
      std::swap(s_.entry_keys[0], s_.entry_keys[1]);
    }
  }

  // Before the keyed box only filters and maps handing the key on (it
  // reaches the keyed box as the router hashed it); after it only filters
  // and maps (row by row, order kept), none re-stamping event times, and
  // with `top` no filter and the ranked field handed on.
  void check_around_keyed() {
    const uint32_t k = keyed();
    const std::string kq = quote(def_.boxes[k].id);
    std::vector<bool> before(def_.boxes.size(), false), after(def_.boxes.size(), false);
    after[k] = true;
    for (uint32_t b : s_.boxes)  // topological: sources first
      for (const Source& src : def_.boxes[b].sources)
        if (src.kind == Source::Kind::box && in_[src.index] && after[src.index]) after[b] = true;
    before[k] = true;
    for (auto it = s_.boxes.rbegin(); it != s_.boxes.rend(); ++it)
      for (const auto& ts : def_.boxes[*it].targets)
        for (const Target& t : ts)
          if (t.kind == Target::Kind::box && in_[t.index] && before[t.index]) before[*it] = true;
    const auto top_by = shape_top_by(s_);
    for (uint32_t b : s_.boxes) {
      if (b == k) continue;
      const std::string& type = def_.boxes[b].type;
      const rapidjson::Value& o = *def_.boxes[b].options;
      if (before[b] && type == "map") {
        // The router hashes the fragment's input: a map before the keyed
        // box must hand each key field on as it is.
        for (const std::string& key : keys_of_side_[size_t(std::max(side_[b], 0))])
          if (!hands_on(o, key))
            diag_.error(path(b), "box " + name(b) + " comes before the keyed aggregate " + kq +
                                     " and does not hand its key field " + quote(key) + " on as it is (\"expr\": " +
                                     quote(key) + "): the router hashes the fragment's input");
      } else if (before[b] && type != "filter") {
        diag_.error(path(b), "box " + name(b) + " comes before the keyed aggregate " + kq +
                                 ": the router hashes the fragment's input, so only filters and maps that hand the "
                                 "key on may come before it");
      } else if (after[b] && type != "filter" && type != "map") {
        diag_.error(path(b), "box " + name(b) + " comes after the keyed aggregate: only filters and maps may");
      } else if (after[b] && top_by && type == "filter") {
        diag_.error(path(b), "box " + name(b) + " comes after the keyed aggregate " + kq +
                                 ", which has top: the merge ranks the parts' rows again, and would rank what the "
                                 "filter left rather than what the aggregate emitted");
      } else if (after[b] && top_by && type == "map" && !hands_on(o, *top_by)) {
        diag_.error(path(b), "map " + quote(def_.boxes[b].id) + " after the keyed aggregate " + kq +
                                 " does not hand the field its top ranks by, " + quote(*top_by) +
                                 ", on as it is (\"expr\": " + quote(*top_by) +
                                 "): the merge ranks the parts' rows again by it");
      } else if (after[b] && type == "map" && o.HasMember("event_time")) {
        diag_.error(path(b) + ".options.event_time", "map " + quote(def_.boxes[b].id) + " after the keyed "
                                                     "aggregate gives its rows new event times, by which the merge "
                                                     "would order them otherwise than the aggregate emitted them");
      } else if (!before[b] && !after[b]) {
        diag_.error(path(b), "box " + name(b) + " is neither before nor after the keyed aggregate " + kq);
      }
    }
  }

  const NetworkDef& def_;
  Diagnostics& diag_;
  Shape s_;
  std::vector<bool> in_;   // per box of the network: in the fragment
  std::vector<int> side_;  // per box before the keyed one: the side it feeds
  std::vector<std::vector<std::string>> keys_of_side_;
};

// The query document with the fragment's boxes out, the router, the
// copies and the merge in: arcs into the fragment go to the router, arcs
// and outputs from its exit port come from the merge.
std::string rewritten_document(const NetworkDef& def, const Shape& shape, const std::set<std::string>& ids,
                               const FragmentSplit& out) {
  rapidjson::Document doc;
  doc.CopyFrom(*def.doc, doc.GetAllocator());
  auto& a = doc.GetAllocator();
  doc.RemoveMember("placement");

  const std::string exit_id = def.boxes[shape.exit.first].id;
  const uint32_t exit_port = shape.exit.second;
  auto copy_of = [&](const std::string& id, size_t part) { return id + "-p" + std::to_string(part); };

  rapidjson::Value boxes(rapidjson::kArrayType);
  std::vector<const rapidjson::Value*> originals;  // the fragment's boxes, in document order
  for (auto& b : doc["boxes"].GetArray()) {
    if (!ids.count(b["id"].GetString())) {
      boxes.PushBack(rapidjson::Value(b, a), a);
      continue;
    }
    originals.push_back(&b);
  }
  for (size_t e = 0; e < shape.entries.size(); ++e) {
    rapidjson::Value router(rapidjson::kObjectType), options(rapidjson::kObjectType), keys(rapidjson::kArrayType),
        ranges(rapidjson::kArrayType);
    for (const auto& k : out.entry_keys[e]) keys.PushBack(str_value(k, a), a);
    for (const auto& p : out.parts) {
      rapidjson::Value r(rapidjson::kArrayType);
      r.PushBack(p.range.begin, a).PushBack(p.range.end, a);
      ranges.PushBack(r, a);
    }
    options.AddMember("mode", "hash", a).AddMember("keys", keys, a).AddMember("ranges", ranges, a);
    const std::string what = shape.entries.size() == 1 ? "input" : e == 0 ? "left input" : "right input";
    router.AddMember("id", str_value(out.router_boxes[e], a), a)
        .AddMember("type", "split", a)
        .AddMember("options", options, a)
        .AddMember("description", str_value("routes fragment " + out.fragment + "'s " + what + " by key group", a), a);
    boxes.PushBack(router, a);
  }
  for (size_t i = 0; i < out.parts.size(); ++i)
    for (const rapidjson::Value* b : originals) {
      rapidjson::Value copy(*b, a);
      copy["id"] = str_value(copy_of(b->operator[]("id").GetString(), i), a);
      boxes.PushBack(copy, a);
    }
  {
    rapidjson::Value merge(rapidjson::kObjectType);
    rapidjson::Value options(rapidjson::kObjectType);
    if (shape.top != nullptr) options.AddMember("top", rapidjson::Value(*shape.top, a), a);
    merge.AddMember("id", str_value(out.merge_box, a), a)
        .AddMember("type", "merge", a)
        .AddMember("options", options, a)
        .AddMember("description", str_value("recombines fragment " + out.fragment + "'s parts in order", a), a);
    boxes.PushBack(merge, a);
  }
  doc["boxes"] = boxes;

  rapidjson::Value arcs(rapidjson::kArrayType);
  auto arc = [&](const std::string& from, const std::string& to) {
    rapidjson::Value v(rapidjson::kObjectType);
    v.AddMember("from", str_value(from, a), a).AddMember("to", str_value(to, a), a);
    arcs.PushBack(v, a);
  };
  std::vector<std::pair<std::string, std::string>> inner;  // arcs inside the fragment, in document order
  for (const auto& v : doc["arcs"].GetArray()) {
    const std::string from = v["from"].GetString(), to = v["to"].GetString();
    const auto [from_id, from_port] = split_end(from);
    const auto [to_id, to_port] = split_end(to);
    const bool from_in = ids.count(from_id) > 0, to_in = ids.count(to_id) > 0;
    if (from_in && to_in) {
      inner.emplace_back(from, to);
    } else if (to_in) {  // an entry: to its router
      size_t e = 0;
      while (e + 1 < shape.entries.size() && !(def.boxes[shape.entries[e].first].id == to_id &&
                                               shape.entries[e].second == to_port))
        ++e;
      arc(from, out.router_boxes[e]);
    } else if (from_in) {
      arc(out.merge_box, to);  // from the one exit port
    } else {
      arc(from, to);
    }
  }
  for (size_t i = 0; i < out.parts.size(); ++i) {
    for (size_t e = 0; e < shape.entries.size(); ++e)
      arc(end_of(out.router_boxes[e], static_cast<uint32_t>(i)),
          end_of(copy_of(def.boxes[shape.entries[e].first].id, i), shape.entries[e].second));
    for (const auto& [from, to] : inner) {
      const auto [from_id, from_port] = split_end(from);
      const auto [to_id, to_port] = split_end(to);
      arc(end_of(copy_of(from_id, i), from_port), end_of(copy_of(to_id, i), to_port));
    }
    arc(end_of(copy_of(exit_id, i), exit_port), end_of(out.merge_box, static_cast<uint32_t>(i)));
  }
  doc["arcs"] = arcs;
  for (auto& o : doc["outputs"].GetArray())
    if (ids.count(split_end(o["from"].GetString()).first)) o["from"] = str_value(out.merge_box, a);

  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  doc.Accept(w);
  return std::string(sb.GetString(), sb.GetSize());
}

}  // namespace

std::vector<SplitPartSpec> equal_split_parts(const std::vector<std::string>& nodes) {
  std::vector<SplitPartSpec> parts;
  for (size_t i = 0; i < nodes.size(); ++i)
    parts.push_back({nodes[i], KeyGroupRange::part(static_cast<uint32_t>(i), static_cast<uint32_t>(nodes.size()))});
  return parts;
}

Result<FragmentSplit> split_fragment(std::string_view network_json, const std::vector<FragmentSpec>& placement,
                                     std::string_view fragment, const std::vector<SplitPartSpec>& parts,
                                     Diagnostics& diag) {
  const size_t first = diag.size();
  Diagnostics parse_diag;
  auto net = QueryNetwork::parse(network_json, parse_diag);
  if (!net.ok()) return make_error(Errc::invalid_argument, "the query network does not parse: " + net.error().message);
  const NetworkDef& def = *net->def();
  auto spec = std::find_if(placement.begin(), placement.end(), [&](const FragmentSpec& f) { return f.name == fragment; });
  if (spec == placement.end()) {
    diag.error("$.fragment", "the placement has no fragment " + quote(fragment));
    return summary(fragment, diag, first);
  }
  check_parts(parts, diag);
  const std::set<std::string> ids(spec->boxes.begin(), spec->boxes.end());
  const Shape shape = ShapeCheck(def, ids, diag).run();
  if (diag.size() > first) return summary(fragment, diag, first);

  FragmentSplit out;
  out.fragment = std::string(fragment);
  out.parts = parts;
  const BoxDef& keyed = def.boxes[static_cast<uint32_t>(shape.keyed)];
  out.keyed_box = keyed.id;
  out.entry_keys = shape.entry_keys;
  out.keys = shape.entry_keys.at(0);
  out.router_fragment = out.fragment + "-split";
  out.merge_fragment = out.fragment + "-merge";
  out.router_box = out.fragment + "-router";
  out.router_boxes.push_back(out.router_box);
  for (size_t e = 1; e < shape.entries.size(); ++e) out.router_boxes.push_back(out.router_box + std::to_string(e));
  out.merge_box = out.fragment + "-merge";
  for (size_t i = 0; i < parts.size(); ++i) out.part_fragments.push_back(out.fragment + "-" + std::to_string(i));

  // Generated names: new, and within their limits.
  std::set<std::string> taken;
  for (const auto& in : def.inputs) taken.insert(in.name);
  for (const auto& b : def.boxes) taken.insert(b.id);
  std::set<std::string> fragments;
  for (const auto& f : placement) fragments.insert(f.name);
  auto new_box = [&](const std::string& id) {
    if (id.size() > kMaxBoxIdLength)
      diag.error("$.boxes", "the generated box id " + quote(id) + " is longer than " + std::to_string(kMaxBoxIdLength) +
                                " characters");
    else if (!taken.insert(id).second)
      diag.error("$.boxes", "the generated box id " + quote(id) + " is taken already by a box or input of the query");
  };
  auto new_fragment = [&](const std::string& name) {
    if (name.size() > kMaxFragmentNameLength)
      diag.error("$.fragment", "the generated fragment name " + quote(name) + " is longer than " +
                                   std::to_string(kMaxFragmentNameLength) + " characters");
    else if (!fragments.insert(name).second)
      diag.error("$.fragment", "the query has a fragment named " + quote(name) + " already");
  };
  for (const auto& r : out.router_boxes) new_box(r);
  new_box(out.merge_box);
  new_fragment(out.router_fragment);
  new_fragment(out.merge_fragment);
  out.part_boxes.resize(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    new_fragment(out.part_fragments[i]);
    for (uint32_t b : shape.boxes) {
      const std::string copy = def.boxes[b].id + "-p" + std::to_string(i);
      new_box(copy);
      out.part_boxes[i].emplace_back(def.boxes[b].id, copy);
    }
  }
  if (diag.size() > first) return summary(fragment, diag, first);

  out.network_json = rewritten_document(def, shape, ids, out);
  Diagnostics rewritten;
  auto parsed = QueryNetwork::parse(out.network_json, rewritten);
  if (!parsed.ok())  // a bug here, not the user's
    return make_error(Errc::corrupt, "fragment '" + out.fragment + "': the split network does not parse: " +
                                          parsed.error().message);
  out.network = std::move(parsed).value();

  for (const auto& f : placement) {
    if (f.name != fragment) {
      out.placement.push_back(f);
      continue;
    }
    out.placement.push_back({out.router_fragment, f.node, out.router_boxes});
    for (size_t i = 0; i < parts.size(); ++i) {
      FragmentSpec p{out.part_fragments[i], parts[i].node, {}};
      for (const auto& [orig, copy] : out.part_boxes[i]) p.boxes.push_back(copy);
      out.placement.push_back(std::move(p));
    }
    out.placement.push_back({out.merge_fragment, f.node, {out.merge_box}});
  }
  Diagnostics cut_diag;
  if (auto cut = cut_query(out.network, out.placement, cut_diag, /*connected=*/false); !cut.ok())
    return make_error(Errc::invalid_argument, "fragment '" + out.fragment + "' cannot be split: the new cut is "
                                                  "invalid: " + cut.error().message);
  return out;
}

namespace {
// carry_snapshot with a key-group range and an input clock map.
Result<std::string> carry_snapshot_into(const QueryNetwork& from, std::string_view bytes, const QueryNetwork& to,
                                        const std::vector<std::pair<std::string, std::string>>& boxes,
                                        const KeyGroupRange* keep,
                                        const std::vector<std::optional<size_t>>& inputs_from);
}  // namespace

Result<std::string> carry_snapshot(const QueryNetwork& from, std::string_view bytes, const QueryNetwork& to,
                                   const std::vector<std::pair<std::string, std::string>>& boxes,
                                   const KeyGroupRange* keep) {
  const NetworkDef& fd = *from.def();
  const NetworkDef& td = *to.def();
  if (fd.inputs.size() != td.inputs.size())
    return make_error(Errc::invalid_argument, "carrying a snapshot of '" + fd.name + "' (" +
                                                  std::to_string(fd.inputs.size()) + " inputs) to '" + td.name +
                                                  "' (" + std::to_string(td.inputs.size()) + ")");
  std::vector<std::optional<size_t>> same(td.inputs.size());
  for (size_t i = 0; i < same.size(); ++i) same[i] = i;
  return carry_snapshot_into(from, bytes, to, boxes, keep, same);
}

Result<std::string> carry_snapshot(const QueryNetwork& from, std::string_view bytes, const QueryNetwork& to,
                                   const std::vector<std::pair<std::string, std::string>>& boxes,
                                   const std::vector<std::optional<size_t>>& inputs_from) {
  return carry_snapshot_into(from, bytes, to, boxes, nullptr, inputs_from);
}

namespace {
Result<std::string> carry_snapshot_into(const QueryNetwork& from, std::string_view bytes, const QueryNetwork& to,
                                        const std::vector<std::pair<std::string, std::string>>& boxes,
                                        const KeyGroupRange* keep,
                                        const std::vector<std::optional<size_t>>& inputs_from) {
  const NetworkDef& fd = *from.def();
  const NetworkDef& td = *to.def();
  if (inputs_from.size() != td.inputs.size())
    return make_error(Errc::invalid_argument, "carrying a snapshot: " + std::to_string(inputs_from.size()) +
                                                  " input clocks for " + std::to_string(td.inputs.size()) + " inputs");
  std::vector<detail::InputClock> from_clocks;
  std::vector<std::unique_ptr<Box>> restored;
  ENTENTE_RETURN_IF_ERROR(detail::read_network_snapshot(fd, bytes, from_clocks, restored, keep));
  std::vector<detail::InputClock> clocks(td.inputs.size());
  for (size_t i = 0; i < clocks.size(); ++i) {
    if (!inputs_from[i]) continue;
    if (*inputs_from[i] >= from_clocks.size())
      return make_error(Errc::invalid_argument, "carrying a snapshot: '" + fd.name + "' has no input " +
                                                    std::to_string(*inputs_from[i]));
    clocks[i] = from_clocks[*inputs_from[i]];
  }
  ENTENTE_ASSIGN_OR_RETURN(auto fresh, detail::build_boxes(td));
  auto index_of = [](const NetworkDef& d, const std::string& id) -> std::optional<size_t> {
    for (size_t b = 0; b < d.boxes.size(); ++b)
      if (d.boxes[b].id == id) return b;
    return std::nullopt;
  };
  for (const auto& [f, t] : boxes) {
    const auto fi = index_of(fd, f);
    const auto ti = index_of(td, t);
    if (!fi || !ti)
      return make_error(Errc::invalid_argument, "carrying a snapshot: no box " + quote(fi ? t : f) + " in '" +
                                                    (fi ? td.name : fd.name) + "'");
    if (fd.boxes[*fi].type != td.boxes[*ti].type)
      return make_error(Errc::invalid_argument, "carrying a snapshot: box " + quote(f) + " is a " +
                                                    fd.boxes[*fi].type + ", " + quote(t) + " a " + td.boxes[*ti].type);
    if (!restored[*fi]) return make_error(Errc::invalid_argument, "carrying a snapshot: box " + quote(f) + " twice");
    fresh[*ti] = std::move(restored[*fi]);
  }
  std::string out;
  detail::write_network_snapshot(td, clocks, fresh, out);
  return out;
}
}  // namespace

std::vector<BoxComparison> compare_boxes(const QueryNetwork& from, const QueryNetwork& to) {
  const NetworkDef& fd = *from.def();
  const NetworkDef& td = *to.def();
  std::vector<BoxComparison> out;
  for (const BoxDef& t : td.boxes) {
    auto f = std::find_if(fd.boxes.begin(), fd.boxes.end(), [&](const BoxDef& b) { return b.id == t.id; });
    if (f == fd.boxes.end()) continue;
    BoxComparison c{t.id, t.type, false, {}};
    if (f->type != t.type) c.why = "its type changed from " + f->type + " to " + t.type;
    else if (!(*f->options == *t.options)) c.why = "its options changed";
    else if (f->input_schemas.size() != t.input_schemas.size())
      c.why = "it has " + std::to_string(t.input_schemas.size()) + " inputs instead of " +
              std::to_string(f->input_schemas.size());
    for (size_t p = 0; c.why.empty() && p < t.input_schemas.size(); ++p)
      if (!(*f->input_schemas[p] == *t.input_schemas[p]))
        c.why = "the schema of its input port " + std::to_string(p) + " changed from (" +
                f->input_schemas[p]->to_string() + ") to (" + t.input_schemas[p]->to_string() + ")";
    c.same = c.why.empty();
    out.push_back(std::move(c));
  }
  return out;
}

Result<std::string> join_snapshots(const QueryNetwork& to, const QueryNetwork& router, std::string_view router_bytes,
                                   const std::vector<SnapshotPart>& parts) {
  const NetworkDef& td = *to.def();
  const NetworkDef& rd = *router.def();
  if (rd.inputs.size() != td.inputs.size())
    return make_error(Errc::invalid_argument, "joining snapshots: the router has " + std::to_string(rd.inputs.size()) +
                                                  " inputs, '" + td.name + "' " + std::to_string(td.inputs.size()));
  if (parts.empty()) return make_error(Errc::invalid_argument, "joining snapshots: no parts");
  std::vector<detail::InputClock> clocks;
  {
    std::vector<std::unique_ptr<Box>> unused;
    ENTENTE_RETURN_IF_ERROR(detail::read_network_snapshot(rd, router_bytes, clocks, unused));
  }
  // Per box of `to`: each part's state of its copy.
  std::map<std::string, std::vector<std::string>> states;
  std::vector<KeyGroupRange> ranges;
  for (const SnapshotPart& p : parts) {
    const NetworkDef& pd = *p.network->def();
    std::vector<detail::InputClock> part_clocks;
    std::vector<std::unique_ptr<Box>> boxes;
    ENTENTE_RETURN_IF_ERROR(detail::read_network_snapshot(pd, p.bytes, part_clocks, boxes));
    for (const auto& [orig, copy] : *p.boxes) {
      size_t b = 0;
      while (b < pd.boxes.size() && pd.boxes[b].id != copy) ++b;
      if (b == pd.boxes.size())
        return make_error(Errc::invalid_argument, "joining snapshots: no box " + quote(copy) + " in '" + pd.name + "'");
      states[orig].push_back(boxes[b]->snapshot());
    }
    ranges.push_back(p.range);
  }
  ENTENTE_ASSIGN_OR_RETURN(auto fresh, detail::build_boxes(td));
  for (size_t b = 0; b < td.boxes.size(); ++b) {
    auto it = states.find(td.boxes[b].id);
    if (it == states.end() || it->second.size() != parts.size())
      return make_error(Errc::invalid_argument, "joining snapshots: not every part has a copy of box " +
                                                    quote(td.boxes[b].id));
    const std::vector<std::string_view> views(it->second.begin(), it->second.end());
    if (Status st = fresh[b]->restore_joined(views, ranges); !st.ok())
      return make_error(st.error().code, "restoring box " + quote(td.boxes[b].id) + " from its parts: " +
                                             st.error().message);
  }
  std::string out;
  detail::write_network_snapshot(td, clocks, fresh, out);
  return out;
}

}  // namespace entente::engine
