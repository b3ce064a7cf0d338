// Parsing and complete validation of query networks. Every problem found is
// reported to Diagnostics with its JSON path; validation goes on after an
// error wherever the rest can still be checked meaningfully, and stops
// checking what depends on a broken part (a box downstream of a box that
// failed to build is not type-checked) so that one mistake gives one error.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "base/json_read.h"
#include "engine/detail/json_kind.h"
#include "engine/detail/network_def.h"
#include "engine/detail/options.h"
#include "rapidjson/error/en.h"

namespace entente::engine::detail {

namespace {

using rapidjson::Value;


std::string_view str_of(const Value& v) { return {v.GetString(), v.GetStringLength()}; }

// A user-supplied string for an error message, cut short so that a huge
// string cannot make a huge diagnostic.
std::string quote(std::string_view s) {
  constexpr size_t kShown = 64;
  std::string out = "'";
  if (s.size() <= kShown) {
    out.append(s);
  } else {
    out.append(s.substr(0, kShown));
    out += "...";
  }
  out += "'";
  return out;
}

std::string index_path(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

// Network names become parts of stream and box names across domains
// (`acme/hot-items/w1`), hence the same alphabet as domain names.
bool valid_network_name(std::string_view s) {
  if (s.empty() || s.size() > kMaxNameLength) return false;
  if (!(s[0] >= 'a' && s[0] <= 'z')) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return true;
}

// Ids of inputs, boxes and outputs. No '.', which separates an id from a
// port in arcs.
bool valid_id(std::string_view s) {
  if (s.empty() || s.size() > kMaxNameLength) return false;
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!alpha(s[0])) return false;
  for (char c : s)
    if (!alpha(c) && !(c >= '0' && c <= '9') && c != '-') return false;
  return true;
}

constexpr std::string_view kIdRule = "expected [A-Za-z_][A-Za-z0-9_-]*, at most 64 characters";

// A stream an input reads: "name" or "domain/name", with a domain
// [a-z][a-z0-9-]* and a stream name [a-z][a-z0-9_-]*, each at most 63.
bool valid_stream_ref(std::string_view s) {
  auto part = [](std::string_view p, bool underscore) {
    if (p.empty() || p.size() > 63 || p[0] < 'a' || p[0] > 'z') return false;
    for (char c : p)
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || (underscore && c == '_'))) return false;
    return true;
  };
  const auto slash = s.find('/');
  if (slash == std::string_view::npos) return part(s, true);
  return part(s.substr(0, slash), false) && part(s.substr(slash + 1), true);
}

constexpr std::string_view kStreamRefRule =
    "expected a stream name [a-z][a-z0-9_-]* or DOMAIN/NAME with a domain [a-z][a-z0-9-]*, each at most 63 characters";

// The deepest nesting of arrays and objects, found before parsing so that a
// hostile document cannot exhaust the stack of whoever walks it later.
// Returns the offset where `limit` is first exceeded, if it is.
std::optional<size_t> nesting_exceeds(std::string_view json, size_t limit) {
  size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < json.size(); ++i) {
    char c = json[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > limit) return i;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return std::nullopt;
}

std::pair<size_t, size_t> line_column(std::string_view text, size_t offset) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

// Reports unknown and duplicate keys of object `obj` (base/json_read.h).
void check_keys(const Value& obj, const std::string& path, std::initializer_list<std::string_view> known,
                Diagnostics& diag) {
  base::check_members(obj, path, known, diag, base::kFieldWords);
}

const Value* member(const Value& obj, std::string_view key) {
  for (auto it = obj.MemberBegin(); it != obj.MemberEnd(); ++it)
    if (str_of(it->name) == key) return &it->value;
  return nullptr;
}

// A required or optional string member; reports a missing or mistyped one.
std::optional<std::string> string_member(const Value& obj, std::string_view key, const std::string& path,
                                         Need need, Diagnostics& diag) {
  const Value* v = member(obj, key);
  std::string kpath = path + "." + std::string(key);
  if (v == nullptr) {
    if (need == Need::required) diag.error(kpath, "missing required field '" + std::string(key) + "'");
    return std::nullopt;
  }
  if (!v->IsString()) {
    diag.error(kpath, "expected a string, got " + std::string(json_kind(*v)));
    return std::nullopt;
  }
  return std::string(str_of(*v));
}

// A required array member, at most `limit` long.
const Value* array_member(const Value& obj, std::string_view key, const std::string& path, size_t limit,
                          std::string_view what, Diagnostics& diag) {
  const Value* v = member(obj, key);
  std::string kpath = path + "." + std::string(key);
  if (v == nullptr) {
    diag.error(kpath, "missing required field '" + std::string(key) + "'");
    return nullptr;
  }
  if (!v->IsArray()) {
    diag.error(kpath, "expected an array, got " + std::string(json_kind(*v)));
    return nullptr;
  }
  if (v->Size() > limit) {
    diag.error(kpath, "too many " + std::string(what) + ": " + std::to_string(v->Size()) + "; the limit is " +
                          std::to_string(limit));
    return nullptr;
  }
  return v;
}

// Schema: [{"name":"price","type":"int64"}, ...]. Every bad field is
// reported, not only the first.
SchemaPtr parse_schema(const Value& v, const std::string& path, Diagnostics& diag) {
  if (!v.IsArray()) {
    diag.error(path, "a schema is an array of {\"name\", \"type\"} objects, got " + std::string(json_kind(v)));
    return nullptr;
  }
  if (v.Size() == 0) {
    diag.error(path, "a schema needs at least one field");
    return nullptr;
  }
  if (v.Size() > kMaxSchemaFields) {
    diag.error(path, "too many fields: " + std::to_string(v.Size()) + "; the limit is " +
                         std::to_string(kMaxSchemaFields));
    return nullptr;
  }
  size_t before = diag.size();
  std::vector<Field> fields;
  std::map<std::string, size_t, std::less<>> seen;
  for (rapidjson::SizeType i = 0; i < v.Size(); ++i) {
    std::string fpath = index_path(path, i);
    const Value& f = v[i];
    if (!f.IsObject()) {
      diag.error(fpath, "expected a {\"name\", \"type\"} object, got " + std::string(json_kind(f)));
      continue;
    }
    check_keys(f, fpath, {"name", "type"}, diag);
    auto name = string_member(f, "name", fpath, Need::required, diag);
    auto type_s = string_member(f, "type", fpath, Need::required, diag);
    std::optional<Type> type;
    if (type_s) {
      type = parse_type(*type_s);
      if (!type) diag.error(fpath + ".type", "unknown type " + quote(*type_s) +
                                                 "; known types: bool double int64 string timestamp");
    }
    if (name) {
      auto one = Schema::make({Field{*name, Type::Int64}});
      if (!one.ok()) {
        diag.error(fpath + ".name", one.error().message);
      } else if (auto [it, fresh] = seen.emplace(*name, i); !fresh) {
        diag.error(fpath + ".name", "duplicate field name " + quote(*name) + " (also at " +
                                        index_path(path, it->second) + ")");
      }
    }
    if (name && type) fields.push_back(Field{*name, *type});
  }
  if (diag.size() != before) return nullptr;
  return make_schema(std::move(fields));
}

struct ParsedInput {
  bool ok = false;
  NetworkInput in;
};

struct ParsedBox {
  std::string id;  // empty if missing
  std::string type;
  BoxFactory factory = nullptr;
  const Value* options = nullptr;
  bool ok = false;  // definition complete (id, known type, options an object)
};

struct Endpoint {
  std::string name;
  std::optional<uint32_t> port;
};

// "name" or "name.port".
std::optional<Endpoint> parse_endpoint(std::string_view s, const std::string& path, Diagnostics& diag) {
  Endpoint e;
  size_t dot = s.find('.');
  e.name = std::string(s.substr(0, dot));
  if (e.name.empty()) {
    diag.error(path, "expected 'id' or 'id.port', got " + quote(s));
    return std::nullopt;
  }
  if (dot != std::string_view::npos) {
    std::string_view p = s.substr(dot + 1);
    uint64_t n = 0;
    bool good = !p.empty() && p.size() <= 4 && (p.size() == 1 || p[0] != '0');
    for (char c : p) {
      if (c < '0' || c > '9') good = false;
      else n = n * 10 + uint64_t(c - '0');
    }
    if (!good) {
      diag.error(path, "bad port in " + quote(s) + ": expected 'id.N' with N a number 0.." +
                           std::to_string(kMaxPorts - 1));
      return std::nullopt;
    }
    if (n >= kMaxPorts) {
      diag.error(path, "port " + std::to_string(n) + " out of range; a box has at most " +
                           std::to_string(kMaxPorts) + " ports");
      return std::nullopt;
    }
    e.port = uint32_t(n);
  }
  return e;
}

// What a name in the shared input/box namespace refers to.
struct NameRef {
  Source::Kind kind;
  uint32_t index;
  std::string path;
};

struct ParsedArc {
  bool ok = false;          // both ends resolved, not a second feed of a port
  Source from;              // box index in JSON order
  uint32_t to_box = 0;      // JSON order
  uint32_t to_port = 0;
};

std::string ports_word(size_t n) { return n == 1 ? "1 output port" : std::to_string(n) + " output ports"; }

Error summary(const NetworkDef& def, const Diagnostics& diag, size_t first, Errc code) {
  size_t n = diag.size() - first;
  std::string msg = "query network";
  if (!def.name.empty()) msg += " '" + def.name + "'";
  msg += " is invalid: " + std::to_string(n) + (n == 1 ? " problem" : " problems");
  const auto& d = diag.items()[first];
  msg += "; first: " + d.path + ": " + d.message;
  return make_error(code, std::move(msg));
}

struct ParsedOutput {
  bool ok = false;   // name valid and unique, `from` resolved to a box
  uint32_t box = 0;  // JSON order
  uint32_t port = 0;
};

// What the steps of build_network_def share: where problems go, the
// definition being filled in, and what each step learned for the later ones.
// Boxes are indexed in JSON order until assemble() renumbers them.
struct Validation {
  Validation(Diagnostics& d, NetworkDef& n) : diag(d), def(n) {}

  Diagnostics& diag;
  NetworkDef& def;
  // The top-level arrays; null where missing or malformed (already reported).
  const Value* inputs_v = nullptr;
  const Value* boxes_v = nullptr;
  const Value* arcs_v = nullptr;
  const Value* outputs_v = nullptr;
  // Inputs and boxes share one namespace, so that an arc's `from` is never
  // ambiguous. A name is registered even when its definition has other
  // errors, so that arcs naming it do not add bogus "unknown" errors.
  std::unordered_map<std::string, NameRef> names;
  std::vector<ParsedInput> inputs;
  std::vector<ParsedBox> boxes;
  std::vector<ParsedArc> arcs;
  // (box, input port) -> arc index, per box in JSON order.
  std::vector<std::map<uint32_t, size_t>> fed;
  std::vector<ParsedOutput> outs;
  std::vector<bool> ports_ok;                     // input ports complete, every feeding arc resolved
  std::vector<std::vector<uint32_t>> succ, pred;  // between boxes, over resolved arcs
  std::vector<uint32_t> order;                    // topological; boxes on or below a cycle are left out
  std::vector<std::unique_ptr<Box>> built;        // type-checked boxes; null where not built

  bool claim(const std::string& name, NameRef ref, const std::string& name_path) {
    auto [it, fresh] = names.emplace(name, ref);
    if (!fresh) {
      diag.error(name_path, "duplicate id " + quote(name) + ": already used by " + it->second.path);
      return false;
    }
    return true;
  }
};

// ---- Parse: JSON text to raw definitions.

// The document as a whole: size, nesting, syntax, an object at the top.
// Fills def.doc; returns the error code when nothing further can be checked.
std::optional<Errc> parse_document(std::string_view json, NetworkDef& def, Diagnostics& diag) {
  if (json.size() > kMaxDocumentBytes) {
    diag.error("$", "document is " + std::to_string(json.size()) + " bytes; the limit is " +
                        std::to_string(kMaxDocumentBytes) + " (4 MiB)");
    return Errc::limit_exceeded;
  }
  if (auto at = nesting_exceeds(json, kMaxNesting)) {
    diag.error("$", "arrays and objects nested deeper than " + std::to_string(kMaxNesting) +
                        " levels at offset " + std::to_string(*at));
    return Errc::limit_exceeded;
  }
  def.doc = std::make_unique<rapidjson::Document>();
  rapidjson::Document& doc = *def.doc;
  doc.Parse<rapidjson::kParseValidateEncodingFlag>(json.data(), json.size());
  if (doc.HasParseError()) {
    size_t off = doc.GetErrorOffset();
    auto [line, col] = line_column(json, off);
    diag.error("$", "JSON syntax error at offset " + std::to_string(off) + " (line " + std::to_string(line) +
                        ", column " + std::to_string(col) + "): " + GetParseError_En(doc.GetParseError()));
    return Errc::parse_error;
  }
  if (!doc.IsObject()) {
    diag.error("$", "a query network is a JSON object, got " + std::string(json_kind(doc)));
    return Errc::invalid_argument;
  }
  return std::nullopt;
}

// Top-level keys, the network name, and the four arrays (present, arrays,
// within their limits, non-empty); sets the *_v members to the usable ones.
void parse_top_level(Validation& v) {
  const Value& doc = *v.def.doc;
  Diagnostics& diag = v.diag;
  check_keys(doc, "$", {"name", "description", "inputs", "boxes", "arcs", "outputs"}, diag);
  if (auto name = string_member(doc, "name", "$", Need::required, diag)) {
    if (valid_network_name(*name)) v.def.name = *name;
    else diag.error("$.name", "bad network name " + quote(*name) + ": expected [a-z][a-z0-9-]*, at most 64 characters");
  }
  if (const Value* d = member(doc, "description"); d != nullptr && !d->IsString())
    diag.error("$.description", "expected a string, got " + std::string(json_kind(*d)));
  v.inputs_v = array_member(doc, "inputs", "$", kMaxInputs, "inputs", diag);
  v.boxes_v = array_member(doc, "boxes", "$", kMaxBoxes, "boxes", diag);
  v.arcs_v = array_member(doc, "arcs", "$", kMaxArcs, "arcs", diag);
  v.outputs_v = array_member(doc, "outputs", "$", kMaxOutputs, "outputs", diag);
  if (v.inputs_v && v.inputs_v->Empty()) diag.error("$.inputs", "a network needs at least one input");
  if (v.boxes_v && v.boxes_v->Empty()) diag.error("$.boxes", "a network needs at least one box");
  if (v.outputs_v && v.outputs_v->Empty()) diag.error("$.outputs", "a network needs at least one output");
}

// One ParsedInput per element of $.inputs: keys, name (claimed), stream,
// schema, event time field against that schema, watermark settings. An
// input is `ok` only if its definition raised no problem.
void parse_inputs(Validation& v) {
  if (!v.inputs_v) return;
  Diagnostics& diag = v.diag;
  v.inputs.resize(v.inputs_v->Size());
  for (rapidjson::SizeType i = 0; i < v.inputs_v->Size(); ++i) {
    std::string path = index_path("$.inputs", i);
    const Value& in = (*v.inputs_v)[i];
    if (!in.IsObject()) {
      diag.error(path, "expected an input object, got " + std::string(json_kind(in)));
      continue;
    }
    size_t before = diag.size();
    check_keys(in, path, {"name", "schema", "event_time", "watermark_lag", "watermarks", "stream"}, diag);
    ParsedInput& pi = v.inputs[i];
    if (auto name = string_member(in, "name", path, Need::required, diag)) {
      if (!valid_id(*name)) diag.error(path + ".name", "bad input name " + quote(*name) + ": " + std::string(kIdRule));
      v.claim(*name, NameRef{Source::Kind::input, uint32_t(i), path}, path + ".name");
      pi.in.name = *name;
    }
    if (auto stream = string_member(in, "stream", path, Need::optional, diag)) {
      if (!valid_stream_ref(*stream))
        diag.error(path + ".stream", "bad stream " + quote(*stream) + ": " + std::string(kStreamRefRule));
      pi.in.stream = *stream;
    }
    if (const Value* s = member(in, "schema"))
      pi.in.schema = parse_schema(*s, path + ".schema", diag);
    else
      diag.error(path + ".schema", "missing required field 'schema'");
    if (auto tf = string_member(in, "event_time", path, Need::optional, diag)) {
      if (pi.in.schema) {
        auto idx = pi.in.schema->index_of(*tf);
        if (!idx) {
          diag.error(path + ".event_time", "event time field " + quote(*tf) + " is not in the schema (" +
                                               pi.in.schema->to_string() + ")");
        } else if (!is_int_repr(pi.in.schema->field(*idx).type)) {
          diag.error(path + ".event_time", "event time field " + quote(*tf) + " has type " +
                                               std::string(type_name(pi.in.schema->field(*idx).type)) +
                                               "; it must be timestamp or int64");
        }
      }
      pi.in.time_field = *tf;
    }
    if (const Value* lag = member(in, "watermark_lag")) {
      if (auto ms = parse_duration_ms(*lag, path + ".watermark_lag", diag)) pi.in.watermark_lag_ms = *ms;
    }
    if (auto mode = string_member(in, "watermarks", path, Need::optional, diag)) {
      if (*mode == "manual") pi.in.auto_watermark = false;
      else if (*mode != "auto")
        diag.error(path + ".watermarks", "unknown value " + quote(*mode) + "; expected one of: auto manual");
    }
    pi.ok = diag.size() == before;
  }
}

// One ParsedBox per element of $.boxes: keys, id (claimed), a known type,
// options an object. Options are not looked into here: the box factory
// checks them in type_check_boxes(). A box is `ok` only if its definition
// raised no problem.
void parse_boxes(Validation& v) {
  if (!v.boxes_v) return;
  Diagnostics& diag = v.diag;
  v.boxes.resize(v.boxes_v->Size());
  for (rapidjson::SizeType i = 0; i < v.boxes_v->Size(); ++i) {
    std::string path = index_path("$.boxes", i);
    const Value& bv = (*v.boxes_v)[i];
    if (!bv.IsObject()) {
      diag.error(path, "expected a box object, got " + std::string(json_kind(bv)));
      continue;
    }
    size_t before = diag.size();
    check_keys(bv, path, {"id", "type", "options", "description"}, diag);
    ParsedBox& pb = v.boxes[i];
    if (auto id = string_member(bv, "id", path, Need::required, diag)) {
      if (!valid_id(*id)) diag.error(path + ".id", "bad box id " + quote(*id) + ": " + std::string(kIdRule));
      if (v.claim(*id, NameRef{Source::Kind::box, uint32_t(i), path}, path + ".id")) pb.id = *id;
    }
    if (auto type = string_member(bv, "type", path, Need::required, diag)) {
      pb.type = *type;
      pb.factory = find_box_factory(*type);
      if (pb.factory == nullptr) {
        std::string msg = "unknown box type " + quote(*type) + "; known types:";
        for (auto t : box_type_names()) {
          msg += ' ';
          msg += t;
        }
        diag.error(path + ".type", msg);
      }
    }
    pb.options = &v.def.empty_options;
    if (const Value* o = member(bv, "options")) {
      if (o->IsObject()) pb.options = o;
      else diag.error(path + ".options", "options must be an object, got " + std::string(json_kind(*o)));
    }
    if (const Value* d = member(bv, "description"); d != nullptr && !d->IsString())
      diag.error(path + ".description", "expected a string, got " + std::string(json_kind(*d)));
    pb.ok = diag.size() == before;
  }
}

// ---- Resolve: names to indices.

// Each arc's ends resolved through the shared namespace: `from` an input or
// a box port, `to` a box input port fed by no other arc. Fills `arcs` and
// `fed` (sized for every box, even without arcs); an arc is `ok` only if
// both ends resolved and it is the first to feed its port.
void resolve_arcs(Validation& v) {
  Diagnostics& diag = v.diag;
  v.fed.resize(v.boxes.size());
  if (!v.arcs_v) return;
  v.arcs.resize(v.arcs_v->Size());
  for (rapidjson::SizeType k = 0; k < v.arcs_v->Size(); ++k) {
    std::string path = index_path("$.arcs", k);
    const Value& av = (*v.arcs_v)[k];
    if (!av.IsObject()) {
      diag.error(path, "expected an arc object {\"from\", \"to\"}, got " + std::string(json_kind(av)));
      continue;
    }
    check_keys(av, path, {"from", "to"}, diag);
    auto from_s = string_member(av, "from", path, Need::required, diag);
    auto to_s = string_member(av, "to", path, Need::required, diag);
    std::optional<Endpoint> from, to;
    if (from_s) from = parse_endpoint(*from_s, path + ".from", diag);
    if (to_s) to = parse_endpoint(*to_s, path + ".to", diag);
    ParsedArc& arc = v.arcs[k];
    bool good = from && to;
    if (from) {
      auto it = v.names.find(from->name);
      if (it == v.names.end()) {
        diag.error(path + ".from", "unknown box or input " + quote(from->name));
        good = false;
      } else if (it->second.kind == Source::Kind::input) {
        if (from->port) {
          diag.error(path + ".from", "input " + quote(from->name) + " has no ports; write just " + quote(from->name));
          good = false;
        }
        arc.from = Source{Source::Kind::input, it->second.index, 0};
      } else {
        arc.from = Source{Source::Kind::box, it->second.index, from->port.value_or(0)};
      }
    }
    if (to) {
      auto it = v.names.find(to->name);
      if (it == v.names.end()) {
        diag.error(path + ".to", "unknown box " + quote(to->name));
        good = false;
      } else if (it->second.kind == Source::Kind::input) {
        diag.error(path + ".to", "an arc cannot feed network input " + quote(to->name) + "; 'to' names a box");
        good = false;
      } else {
        arc.to_box = it->second.index;
        arc.to_port = to->port.value_or(0);
        auto [fit, fresh] = v.fed[arc.to_box].emplace(arc.to_port, k);
        if (!fresh) {
          diag.error(path + ".to", "input port " + std::to_string(arc.to_port) + " of box " + quote(to->name) +
                                       " is already fed by " + index_path("$.arcs", fit->second));
          good = false;
        }
      }
    }
    arc.ok = good;
  }
}

// Each output: a valid name unique among outputs, `from` resolved to a box
// port. Fills `outs` and the name and `from` text of def.outputs.
void resolve_outputs(Validation& v) {
  if (!v.outputs_v) return;
  Diagnostics& diag = v.diag;
  v.outs.resize(v.outputs_v->Size());
  std::unordered_map<std::string, size_t> out_names;
  v.def.outputs.resize(v.outputs_v->Size());
  for (rapidjson::SizeType i = 0; i < v.outputs_v->Size(); ++i) {
    std::string path = index_path("$.outputs", i);
    const Value& ov = (*v.outputs_v)[i];
    if (!ov.IsObject()) {
      diag.error(path, "expected an output object {\"name\", \"from\"}, got " + std::string(json_kind(ov)));
      continue;
    }
    check_keys(ov, path, {"name", "from"}, diag);
    bool good = true;
    if (auto name = string_member(ov, "name", path, Need::required, diag)) {
      if (!valid_id(*name)) {
        diag.error(path + ".name", "bad output name " + quote(*name) + ": " + std::string(kIdRule));
        good = false;
      }
      if (auto [it, fresh] = out_names.emplace(*name, i); !fresh) {
        diag.error(path + ".name", "duplicate output name " + quote(*name) + ": already used by " +
                                       index_path("$.outputs", it->second));
        good = false;
      }
      v.def.outputs[i].name = *name;
    } else {
      good = false;
    }
    auto from_s = string_member(ov, "from", path, Need::required, diag);
    std::optional<Endpoint> from;
    if (from_s) from = parse_endpoint(*from_s, path + ".from", diag);
    if (from) {
      v.def.outputs[i].from = *from_s;
      auto it = v.names.find(from->name);
      if (it == v.names.end()) {
        diag.error(path + ".from", "unknown box " + quote(from->name));
        good = false;
      } else if (it->second.kind == Source::Kind::input) {
        diag.error(path + ".from", "a network output must come from a box; " + quote(from->name) +
                                       " is a network input");
        good = false;
      } else {
        v.outs[i].box = it->second.index;
        v.outs[i].port = from->port.value_or(0);
      }
    } else {
      good = false;
    }
    v.outs[i].ok = good;
  }
}

// Input ports of every box with an id: fed at all, and numbered 0..k-1
// without gaps. Fills ports_ok, also false where a feeding arc did not
// resolve (its problem is already reported).
void check_input_ports(Validation& v) {
  const size_t nb = v.boxes.size();
  v.ports_ok.assign(nb, true);
  for (size_t b = 0; b < nb; ++b) {
    if (v.boxes[b].id.empty()) {
      v.ports_ok[b] = false;
      continue;
    }
    const auto& fed = v.fed[b];
    std::string path = index_path("$.boxes", b);
    if (fed.empty()) {
      v.diag.error(path, "box " + quote(v.boxes[b].id) + " has no input: no arc leads to it");
      v.ports_ok[b] = false;
      continue;
    }
    uint32_t expect = 0;
    for (const auto& [port, arc] : fed) {
      (void)arc;
      if (port != expect) {
        std::string fed_list;
        for (const auto& [p, a] : fed) {
          (void)a;
          if (!fed_list.empty()) fed_list += ", ";
          fed_list += std::to_string(p);
        }
        v.diag.error(path, "input port " + std::to_string(expect) + " of box " + quote(v.boxes[b].id) +
                               " is not fed; input ports must be numbered 0..k-1 without gaps (fed: " + fed_list + ")");
        v.ports_ok[b] = false;
        break;
      }
      ++expect;
    }
    for (const auto& [port, k] : fed)
      if (!v.arcs[k].ok) v.ports_ok[b] = false;
  }
}

// ---- Topology: the graph of boxes.

// succ/pred over resolved arcs, then a topological order (Kahn) into
// `order`. What remains lies on a cycle or downstream of one; each cycle is
// reported once, at the box of the cycle that comes first in the document.
void order_boxes(Validation& v) {
  const size_t nb = v.boxes.size();
  auto& succ = v.succ;
  auto& pred = v.pred;
  succ.assign(nb, {});
  pred.assign(nb, {});
  for (const auto& arc : v.arcs) {
    if (!arc.ok || arc.from.kind != Source::Kind::box) continue;
    succ[arc.from.index].push_back(arc.to_box);
    pred[arc.to_box].push_back(arc.from.index);
  }
  auto& order = v.order;
  std::vector<size_t> indeg(nb, 0);
  for (size_t b = 0; b < nb; ++b) indeg[b] = pred[b].size();
  for (size_t b = 0; b < nb; ++b)
    if (indeg[b] == 0) order.push_back(uint32_t(b));
  for (size_t h = 0; h < order.size(); ++h)
    for (uint32_t s : succ[order[h]])
      if (--indeg[s] == 0) order.push_back(s);
  if (order.size() == nb) return;
  std::vector<bool> left(nb, false);
  for (size_t b = 0; b < nb; ++b) left[b] = indeg[b] > 0;
  for (size_t start = 0; start < nb; ++start) {
    if (!left[start]) continue;
    // Every remaining box has a remaining predecessor, so walking
    // backwards must revisit a box: that closes a cycle.
    std::vector<int> seen_at(nb, -1);
    std::vector<uint32_t> walk;
    uint32_t cur = uint32_t(start);
    while (seen_at[cur] < 0) {
      seen_at[cur] = int(walk.size());
      walk.push_back(cur);
      uint32_t next = cur;
      for (uint32_t p : pred[cur])
        if (left[p]) { next = p; break; }
      cur = next;
    }
    std::vector<uint32_t> cycle(walk.begin() + seen_at[cur], walk.end());
    std::reverse(cycle.begin(), cycle.end());  // in arc direction
    // Start the cycle at the box that comes first in the document.
    auto first_it = std::min_element(cycle.begin(), cycle.end());
    std::rotate(cycle.begin(), first_it, cycle.end());
    std::string msg = "cycle: ";
    for (uint32_t b : cycle) msg += v.boxes[b].id + " -> ";
    msg += v.boxes[cycle[0]].id;
    v.diag.error(index_path("$.boxes", cycle[0]), msg);
    // Everything reachable from this cycle is accounted for.
    std::vector<uint32_t> stack(cycle.begin(), cycle.end());
    while (!stack.empty()) {
      uint32_t b = stack.back();
      stack.pop_back();
      if (!left[b]) continue;
      left[b] = false;
      for (uint32_t s : succ[b]) stack.push_back(s);
    }
  }
}

// Reports every box with an id from which no resolved network output can
// be reached.
void report_unused_boxes(const Validation& v) {
  const size_t nb = v.boxes.size();
  std::vector<bool> useful(nb, false);
  std::vector<uint32_t> stack;
  for (const auto& o : v.outs)
    if (o.ok) stack.push_back(o.box);
  while (!stack.empty()) {
    uint32_t b = stack.back();
    stack.pop_back();
    if (useful[b]) continue;
    useful[b] = true;
    for (uint32_t p : v.pred[b]) stack.push_back(p);
  }
  for (size_t b = 0; b < nb; ++b)
    if (!useful[b] && !v.boxes[b].id.empty())
      v.diag.error(index_path("$.boxes", b), "box " + quote(v.boxes[b].id) + " feeds no output");
}

// ---- Type-check: schemas through the boxes.

// Builds every box whose inputs are known, in topological order, so that
// each factory checks its options and expressions against its real input
// schemas. A box whose upstream failed is skipped: its errors would only
// echo that one. Fills `built`.
void type_check_boxes(Validation& v) {
  v.built.resize(v.boxes.size());
  for (uint32_t b : v.order) {
    const ParsedBox& pb = v.boxes[b];
    if (!pb.ok || !v.ports_ok[b]) continue;
    BoxBuildContext ctx;
    ctx.path = index_path("$.boxes", b);
    ctx.diag = &v.diag;
    bool ready = true;
    for (const auto& [port, k] : v.fed[b]) {
      (void)port;
      const Source& src = v.arcs[k].from;
      if (src.kind == Source::Kind::input) {
        if (!v.inputs[src.index].in.schema) ready = false;
        else ctx.inputs.push_back(v.inputs[src.index].in.schema);
      } else {
        const Box* up = v.built[src.index].get();
        if (up == nullptr || src.port >= up->num_outputs()) ready = false;
        else ctx.inputs.push_back(up->output_schema(src.port));
      }
    }
    if (!ready) continue;
    size_t before = v.diag.size();
    std::unique_ptr<Box> box = pb.factory(*pb.options, ctx);
    if (!box) {
      if (v.diag.size() == before)
        v.diag.error(ctx.path, "box " + quote(pb.id) + " of type '" + pb.type + "' could not be built");
      continue;
    }
    if (box->num_inputs() != ctx.inputs.size()) {
      v.diag.error(ctx.path, "box " + quote(pb.id) + " of type '" + pb.type + "' takes " +
                                 std::to_string(box->num_inputs()) + " input(s), but " +
                                 std::to_string(ctx.inputs.size()) + " are fed");
      continue;
    }
    v.built[b] = std::move(box);
  }
}

// Output ports named by arcs and outputs exist (checked once each, only
// where the upstream box was built); sets the schema of each such output.
void check_output_ports(Validation& v) {
  auto no_port = [&](uint32_t box, size_t n, uint32_t port) {
    return "box " + quote(v.boxes[box].id) + " has " + ports_word(n) + " (0.." + std::to_string(n - 1) +
           "); there is no port " + std::to_string(port);
  };
  for (size_t k = 0; k < v.arcs.size(); ++k) {
    const auto& arc = v.arcs[k];
    if (!arc.ok || arc.from.kind != Source::Kind::box || !v.built[arc.from.index]) continue;
    size_t n = v.built[arc.from.index]->num_outputs();
    if (arc.from.port >= n)
      v.diag.error(index_path("$.arcs", k) + ".from", no_port(arc.from.index, n, arc.from.port));
  }
  for (size_t i = 0; i < v.outs.size(); ++i) {
    const auto& o = v.outs[i];
    if (!o.ok || !v.built[o.box]) continue;
    size_t n = v.built[o.box]->num_outputs();
    if (o.port >= n) v.diag.error(index_path("$.outputs", i) + ".from", no_port(o.box, n, o.port));
    else v.def.outputs[i].schema = v.built[o.box]->output_schema(o.port);
  }
}

// ---- Assemble: only for a network without problems.

// The runtime form in def: inputs, boxes in topological order with their
// schemas and sources, and fan-out lists in arc order followed by network
// outputs, so that delivery order is fixed by the document.
void assemble(Validation& v) {
  NetworkDef& def = v.def;
  const size_t nb = v.boxes.size();
  std::vector<uint32_t> topo_of(nb);
  for (size_t t = 0; t < v.order.size(); ++t) topo_of[v.order[t]] = uint32_t(t);
  for (const auto& pi : v.inputs) def.inputs.push_back(pi.in);
  def.input_targets.resize(def.inputs.size());
  def.boxes.resize(nb);
  for (size_t t = 0; t < v.order.size(); ++t) {
    uint32_t b = v.order[t];
    BoxDef& bd = def.boxes[t];
    bd.id = v.boxes[b].id;
    bd.type = v.boxes[b].type;
    bd.json_index = b;
    bd.options = v.boxes[b].options;
    bd.factory = v.boxes[b].factory;
    const Box& box = *v.built[b];
    for (size_t p = 0; p < box.num_outputs(); ++p) bd.output_schemas.push_back(box.output_schema(p));
    bd.targets.resize(box.num_outputs());
    for (const auto& [port, k] : v.fed[b]) {
      Source src = v.arcs[k].from;
      if (src.kind == Source::Kind::box) {
        bd.input_schemas.push_back(v.built[src.index]->output_schema(src.port));
        src.index = topo_of[src.index];
      } else {
        bd.input_schemas.push_back(def.inputs[src.index].schema);
      }
      bd.sources.push_back(src);
    }
  }
  for (const auto& arc : v.arcs) {
    Target t{Target::Kind::box, topo_of[arc.to_box], arc.to_port};
    if (arc.from.kind == Source::Kind::input) def.input_targets[arc.from.index].push_back(t);
    else def.boxes[topo_of[arc.from.index]].targets[arc.from.port].push_back(t);
  }
  for (size_t i = 0; i < v.outs.size(); ++i)
    def.boxes[topo_of[v.outs[i].box]].targets[v.outs[i].port].push_back(Target{Target::Kind::output, uint32_t(i), 0});
}

}  // namespace

// The steps run in the order their problems are reported: everything that
// can be parsed and resolved is, then the graph is ordered, then boxes are
// type-checked in that order. The definition is assembled only when no step
// found a problem.
Result<std::shared_ptr<const NetworkDef>> build_network_def(std::string_view json, Diagnostics& diag) {
  const size_t first = diag.size();
  auto def = std::make_shared<NetworkDef>();
  if (auto code = parse_document(json, *def, diag)) return summary(*def, diag, first, *code);
  Validation v(diag, *def);
  parse_top_level(v);
  parse_inputs(v);
  parse_boxes(v);
  resolve_arcs(v);
  resolve_outputs(v);
  check_input_ports(v);
  order_boxes(v);
  report_unused_boxes(v);
  type_check_boxes(v);
  check_output_ports(v);
  if (diag.size() != first) return summary(*def, diag, first, Errc::invalid_argument);
  assemble(v);
  return std::shared_ptr<const NetworkDef>(std::move(def));
}

}  // namespace entente::engine::detail
