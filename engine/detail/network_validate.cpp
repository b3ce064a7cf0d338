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

// Reports unknown and duplicate keys of object `obj`.
void check_keys(const Value& obj, const std::string& path, std::initializer_list<std::string_view> known,
                Diagnostics& diag) {
  std::set<std::string_view> seen;
  for (auto it = obj.MemberBegin(); it != obj.MemberEnd(); ++it) {
    std::string_view k = str_of(it->name);
    std::string kpath = path + "." + std::string(k);
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      std::string msg = "unknown field " + quote(k) + "; known fields:";
      for (auto kk : known) {
        msg += ' ';
        msg += kk;
      }
      diag.error(kpath, msg);
    } else if (!seen.insert(k).second) {
      diag.error(kpath, "duplicate field " + quote(k));
    }
  }
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

}  // namespace

Result<std::shared_ptr<const NetworkDef>> build_network_def(std::string_view json, Diagnostics& diag) {
  const size_t first = diag.size();
  auto def = std::make_shared<NetworkDef>();
  auto fail = [&](Errc code) -> Result<std::shared_ptr<const NetworkDef>> {
    return summary(*def, diag, first, code);
  };

  // ---- The document as a whole: size, nesting, syntax.
  if (json.size() > kMaxDocumentBytes) {
    diag.error("$", "document is " + std::to_string(json.size()) + " bytes; the limit is " +
                        std::to_string(kMaxDocumentBytes) + " (4 MiB)");
    return fail(Errc::limit_exceeded);
  }
  if (auto at = nesting_exceeds(json, kMaxNesting)) {
    diag.error("$", "arrays and objects nested deeper than " + std::to_string(kMaxNesting) +
                        " levels at offset " + std::to_string(*at));
    return fail(Errc::limit_exceeded);
  }
  def->doc = std::make_unique<rapidjson::Document>();
  rapidjson::Document& doc = *def->doc;
  doc.Parse<rapidjson::kParseValidateEncodingFlag>(json.data(), json.size());
  if (doc.HasParseError()) {
    size_t off = doc.GetErrorOffset();
    auto [line, col] = line_column(json, off);
    diag.error("$", "JSON syntax error at offset " + std::to_string(off) + " (line " + std::to_string(line) +
                        ", column " + std::to_string(col) + "): " + GetParseError_En(doc.GetParseError()));
    return fail(Errc::parse_error);
  }
  if (!doc.IsObject()) {
    diag.error("$", "a query network is a JSON object, got " + std::string(json_kind(doc)));
    return fail(Errc::invalid_argument);
  }

  // ---- Top level.
  check_keys(doc, "$", {"name", "description", "inputs", "boxes", "arcs", "outputs"}, diag);
  if (auto name = string_member(doc, "name", "$", Need::required, diag)) {
    if (valid_network_name(*name)) def->name = *name;
    else diag.error("$.name", "bad network name " + quote(*name) + ": expected [a-z][a-z0-9-]*, at most 64 characters");
  }
  if (const Value* d = member(doc, "description"); d != nullptr && !d->IsString())
    diag.error("$.description", "expected a string, got " + std::string(json_kind(*d)));
  const Value* inputs_v = array_member(doc, "inputs", "$", kMaxInputs, "inputs", diag);
  const Value* boxes_v = array_member(doc, "boxes", "$", kMaxBoxes, "boxes", diag);
  const Value* arcs_v = array_member(doc, "arcs", "$", kMaxArcs, "arcs", diag);
  const Value* outputs_v = array_member(doc, "outputs", "$", kMaxOutputs, "outputs", diag);
  if (inputs_v && inputs_v->Empty()) diag.error("$.inputs", "a network needs at least one input");
  if (boxes_v && boxes_v->Empty()) diag.error("$.boxes", "a network needs at least one box");
  if (outputs_v && outputs_v->Empty()) diag.error("$.outputs", "a network needs at least one output");

  // Inputs and boxes share one namespace, so that an arc's `from` is never
  // ambiguous. A name is registered even when its definition has other
  // errors, so that arcs naming it do not add bogus "unknown" errors.
  std::unordered_map<std::string, NameRef> names;
  auto claim = [&](const std::string& name, NameRef ref, const std::string& name_path) {
    auto [it, fresh] = names.emplace(name, ref);
    if (!fresh) {
      diag.error(name_path, "duplicate id " + quote(name) + ": already used by " + it->second.path);
      return false;
    }
    return true;
  };

  // ---- Inputs.
  std::vector<ParsedInput> inputs;
  if (inputs_v) {
    inputs.resize(inputs_v->Size());
    for (rapidjson::SizeType i = 0; i < inputs_v->Size(); ++i) {
      std::string path = index_path("$.inputs", i);
      const Value& v = (*inputs_v)[i];
      if (!v.IsObject()) {
        diag.error(path, "expected an input object, got " + std::string(json_kind(v)));
        continue;
      }
      size_t before = diag.size();
      check_keys(v, path, {"name", "schema", "event_time", "watermark_lag", "watermarks", "stream"}, diag);
      ParsedInput& pi = inputs[i];
      if (auto name = string_member(v, "name", path, Need::required, diag)) {
        if (!valid_id(*name)) diag.error(path + ".name", "bad input name " + quote(*name) + ": " + std::string(kIdRule));
        claim(*name, NameRef{Source::Kind::input, uint32_t(i), path}, path + ".name");
        pi.in.name = *name;
      }
      if (auto stream = string_member(v, "stream", path, Need::optional, diag)) {
        if (!valid_stream_ref(*stream))
          diag.error(path + ".stream", "bad stream " + quote(*stream) + ": " + std::string(kStreamRefRule));
        pi.in.stream = *stream;
      }
      if (const Value* s = member(v, "schema"))
        pi.in.schema = parse_schema(*s, path + ".schema", diag);
      else
        diag.error(path + ".schema", "missing required field 'schema'");
      if (auto tf = string_member(v, "event_time", path, Need::optional, diag)) {
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
      if (const Value* lag = member(v, "watermark_lag")) {
        if (auto ms = parse_duration_ms(*lag, path + ".watermark_lag", diag)) pi.in.watermark_lag_ms = *ms;
      }
      if (auto mode = string_member(v, "watermarks", path, Need::optional, diag)) {
        if (*mode == "manual") pi.in.auto_watermark = false;
        else if (*mode != "auto")
          diag.error(path + ".watermarks", "unknown value " + quote(*mode) + "; expected one of: auto manual");
      }
      pi.ok = diag.size() == before;
    }
  }

  // ---- Boxes.
  std::vector<ParsedBox> boxes;
  if (boxes_v) {
    boxes.resize(boxes_v->Size());
    for (rapidjson::SizeType i = 0; i < boxes_v->Size(); ++i) {
      std::string path = index_path("$.boxes", i);
      const Value& v = (*boxes_v)[i];
      if (!v.IsObject()) {
        diag.error(path, "expected a box object, got " + std::string(json_kind(v)));
        continue;
      }
      size_t before = diag.size();
      check_keys(v, path, {"id", "type", "options", "description"}, diag);
      ParsedBox& pb = boxes[i];
      if (auto id = string_member(v, "id", path, Need::required, diag)) {
        if (!valid_id(*id)) diag.error(path + ".id", "bad box id " + quote(*id) + ": " + std::string(kIdRule));
        if (claim(*id, NameRef{Source::Kind::box, uint32_t(i), path}, path + ".id")) pb.id = *id;
      }
      if (auto type = string_member(v, "type", path, Need::required, diag)) {
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
      pb.options = &def->empty_options;
      if (const Value* o = member(v, "options")) {
        if (o->IsObject()) pb.options = o;
        else diag.error(path + ".options", "options must be an object, got " + std::string(json_kind(*o)));
      }
      if (const Value* d = member(v, "description"); d != nullptr && !d->IsString())
        diag.error(path + ".description", "expected a string, got " + std::string(json_kind(*d)));
      pb.ok = diag.size() == before;
    }
  }

  // ---- Arcs: resolve both ends; each input port is fed exactly once.
  std::vector<ParsedArc> arcs;
  // (box, input port) -> arc index, per box in JSON order.
  std::vector<std::map<uint32_t, size_t>> fed(boxes.size());
  if (arcs_v) {
    arcs.resize(arcs_v->Size());
    for (rapidjson::SizeType k = 0; k < arcs_v->Size(); ++k) {
      std::string path = index_path("$.arcs", k);
      const Value& v = (*arcs_v)[k];
      if (!v.IsObject()) {
        diag.error(path, "expected an arc object {\"from\", \"to\"}, got " + std::string(json_kind(v)));
        continue;
      }
      check_keys(v, path, {"from", "to"}, diag);
      auto from_s = string_member(v, "from", path, Need::required, diag);
      auto to_s = string_member(v, "to", path, Need::required, diag);
      std::optional<Endpoint> from, to;
      if (from_s) from = parse_endpoint(*from_s, path + ".from", diag);
      if (to_s) to = parse_endpoint(*to_s, path + ".to", diag);
      ParsedArc& arc = arcs[k];
      bool good = from && to;
      if (from) {
        auto it = names.find(from->name);
        if (it == names.end()) {
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
        auto it = names.find(to->name);
        if (it == names.end()) {
          diag.error(path + ".to", "unknown box " + quote(to->name));
          good = false;
        } else if (it->second.kind == Source::Kind::input) {
          diag.error(path + ".to", "an arc cannot feed network input " + quote(to->name) + "; 'to' names a box");
          good = false;
        } else {
          arc.to_box = it->second.index;
          arc.to_port = to->port.value_or(0);
          auto [fit, fresh] = fed[arc.to_box].emplace(arc.to_port, k);
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

  // ---- Outputs: names unique among outputs; `from` names a box.
  struct ParsedOutput {
    bool ok = false;
    uint32_t box = 0;  // JSON order
    uint32_t port = 0;
  };
  std::vector<ParsedOutput> outs;
  if (outputs_v) {
    outs.resize(outputs_v->Size());
    std::unordered_map<std::string, size_t> out_names;
    def->outputs.resize(outputs_v->Size());
    for (rapidjson::SizeType i = 0; i < outputs_v->Size(); ++i) {
      std::string path = index_path("$.outputs", i);
      const Value& v = (*outputs_v)[i];
      if (!v.IsObject()) {
        diag.error(path, "expected an output object {\"name\", \"from\"}, got " + std::string(json_kind(v)));
        continue;
      }
      check_keys(v, path, {"name", "from"}, diag);
      bool good = true;
      if (auto name = string_member(v, "name", path, Need::required, diag)) {
        if (!valid_id(*name)) {
          diag.error(path + ".name", "bad output name " + quote(*name) + ": " + std::string(kIdRule));
          good = false;
        }
        if (auto [it, fresh] = out_names.emplace(*name, i); !fresh) {
          diag.error(path + ".name", "duplicate output name " + quote(*name) + ": already used by " +
                                         index_path("$.outputs", it->second));
          good = false;
        }
        def->outputs[i].name = *name;
      } else {
        good = false;
      }
      auto from_s = string_member(v, "from", path, Need::required, diag);
      std::optional<Endpoint> from;
      if (from_s) from = parse_endpoint(*from_s, path + ".from", diag);
      if (from) {
        def->outputs[i].from = *from_s;
        auto it = names.find(from->name);
        if (it == names.end()) {
          diag.error(path + ".from", "unknown box " + quote(from->name));
          good = false;
        } else if (it->second.kind == Source::Kind::input) {
          diag.error(path + ".from", "a network output must come from a box; " + quote(from->name) +
                                         " is a network input");
          good = false;
        } else {
          outs[i].box = it->second.index;
          outs[i].port = from->port.value_or(0);
        }
      } else {
        good = false;
      }
      outs[i].ok = good;
    }
  }

  // ---- Graph checks over the boxes (JSON order).
  const size_t nb = boxes.size();
  std::vector<std::vector<uint32_t>> succ(nb), pred(nb);
  for (const auto& arc : arcs) {
    if (!arc.ok || arc.from.kind != Source::Kind::box) continue;
    succ[arc.from.index].push_back(arc.to_box);
    pred[arc.to_box].push_back(arc.from.index);
  }

  // Input ports: fed, and numbered 0..k-1 without gaps.
  std::vector<bool> ports_ok(nb, true);
  for (size_t b = 0; b < nb; ++b) {
    if (boxes[b].id.empty()) {
      ports_ok[b] = false;
      continue;
    }
    std::string path = index_path("$.boxes", b);
    if (fed[b].empty()) {
      diag.error(path, "box " + quote(boxes[b].id) + " has no input: no arc leads to it");
      ports_ok[b] = false;
      continue;
    }
    uint32_t expect = 0;
    for (const auto& [port, arc] : fed[b]) {
      (void)arc;
      if (port != expect) {
        std::string fed_list;
        for (const auto& [p, a] : fed[b]) {
          (void)a;
          if (!fed_list.empty()) fed_list += ", ";
          fed_list += std::to_string(p);
        }
        diag.error(path, "input port " + std::to_string(expect) + " of box " + quote(boxes[b].id) +
                             " is not fed; input ports must be numbered 0..k-1 without gaps (fed: " + fed_list + ")");
        ports_ok[b] = false;
        break;
      }
      ++expect;
    }
    for (const auto& [port, k] : fed[b])
      if (!arcs[k].ok) ports_ok[b] = false;
  }

  // Topological order (Kahn). What remains lies on a cycle or downstream of
  // one; each cycle is named once.
  std::vector<uint32_t> order;
  std::vector<size_t> indeg(nb, 0);
  for (size_t b = 0; b < nb; ++b) indeg[b] = pred[b].size();
  for (size_t b = 0; b < nb; ++b)
    if (indeg[b] == 0) order.push_back(uint32_t(b));
  for (size_t h = 0; h < order.size(); ++h)
    for (uint32_t s : succ[order[h]])
      if (--indeg[s] == 0) order.push_back(s);
  if (order.size() < nb) {
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
      for (uint32_t b : cycle) msg += boxes[b].id + " -> ";
      msg += boxes[cycle[0]].id;
      diag.error(index_path("$.boxes", cycle[0]), msg);
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

  // Unused boxes: those from which no network output can be reached.
  {
    std::vector<bool> useful(nb, false);
    std::vector<uint32_t> stack;
    for (const auto& o : outs)
      if (o.ok) stack.push_back(o.box);
    while (!stack.empty()) {
      uint32_t b = stack.back();
      stack.pop_back();
      if (useful[b]) continue;
      useful[b] = true;
      for (uint32_t p : pred[b]) stack.push_back(p);
    }
    for (size_t b = 0; b < nb; ++b)
      if (!useful[b] && !boxes[b].id.empty())
        diag.error(index_path("$.boxes", b), "box " + quote(boxes[b].id) + " feeds no output");
  }

  // ---- Build every box whose inputs are known, in topological order, so
  // that each factory type-checks against its real input schemas. A box
  // whose upstream failed is skipped: its errors would only echo that one.
  std::vector<std::unique_ptr<Box>> built(nb);
  for (uint32_t b : order) {
    const ParsedBox& pb = boxes[b];
    if (!pb.ok || !ports_ok[b]) continue;
    BoxBuildContext ctx;
    ctx.path = index_path("$.boxes", b);
    ctx.diag = &diag;
    bool ready = true;
    for (const auto& [port, k] : fed[b]) {
      (void)port;
      const Source& src = arcs[k].from;
      if (src.kind == Source::Kind::input) {
        if (!inputs[src.index].in.schema) ready = false;
        else ctx.inputs.push_back(inputs[src.index].in.schema);
      } else {
        const Box* up = built[src.index].get();
        if (up == nullptr || src.port >= up->num_outputs()) ready = false;
        else ctx.inputs.push_back(up->output_schema(src.port));
      }
    }
    if (!ready) continue;
    size_t before = diag.size();
    std::unique_ptr<Box> box = pb.factory(*pb.options, ctx);
    if (!box) {
      if (diag.size() == before) diag.error(ctx.path, "box " + quote(pb.id) + " of type '" + pb.type + "' could not be built");
      continue;
    }
    if (box->num_inputs() != ctx.inputs.size()) {
      diag.error(ctx.path, "box " + quote(pb.id) + " of type '" + pb.type + "' takes " +
                               std::to_string(box->num_inputs()) + " input(s), but " +
                               std::to_string(ctx.inputs.size()) + " are fed");
      continue;
    }
    built[b] = std::move(box);
  }

  // Output ports named by arcs and outputs must exist (checked once each,
  // only where the upstream box was built).
  for (size_t k = 0; k < arcs.size(); ++k) {
    const auto& arc = arcs[k];
    if (!arc.ok || arc.from.kind != Source::Kind::box || !built[arc.from.index]) continue;
    size_t n = built[arc.from.index]->num_outputs();
    if (arc.from.port >= n)
      diag.error(index_path("$.arcs", k) + ".from", "box " + quote(boxes[arc.from.index].id) + " has " + ports_word(n) +
                                                       " (0.." + std::to_string(n - 1) + "); there is no port " +
                                                       std::to_string(arc.from.port));
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    const auto& o = outs[i];
    if (!o.ok || !built[o.box]) continue;
    size_t n = built[o.box]->num_outputs();
    if (o.port >= n) {
      diag.error(index_path("$.outputs", i) + ".from", "box " + quote(boxes[o.box].id) + " has " + ports_word(n) +
                                                           " (0.." + std::to_string(n - 1) + "); there is no port " +
                                                           std::to_string(o.port));
    } else {
      def->outputs[i].schema = built[o.box]->output_schema(o.port);
    }
  }

  if (diag.size() != first) return fail(Errc::invalid_argument);

  // ---- Everything is valid: resolve into the runtime form, boxes in
  // topological order.
  std::vector<uint32_t> topo_of(nb);
  for (size_t t = 0; t < order.size(); ++t) topo_of[order[t]] = uint32_t(t);
  for (const auto& pi : inputs) def->inputs.push_back(pi.in);
  def->input_targets.resize(def->inputs.size());
  def->boxes.resize(nb);
  for (size_t t = 0; t < order.size(); ++t) {
    uint32_t b = order[t];
    BoxDef& bd = def->boxes[t];
    bd.id = boxes[b].id;
    bd.type = boxes[b].type;
    bd.json_index = b;
    bd.options = boxes[b].options;
    bd.factory = boxes[b].factory;
    const Box& box = *built[b];
    for (size_t p = 0; p < box.num_outputs(); ++p) bd.output_schemas.push_back(box.output_schema(p));
    bd.targets.resize(box.num_outputs());
    for (const auto& [port, k] : fed[b]) {
      Source src = arcs[k].from;
      if (src.kind == Source::Kind::box) {
        bd.input_schemas.push_back(built[src.index]->output_schema(src.port));
        src.index = topo_of[src.index];
      } else {
        bd.input_schemas.push_back(def->inputs[src.index].schema);
      }
      bd.sources.push_back(src);
    }
  }
  // Fan-out lists in arc order, then network outputs, so that delivery
  // order is fixed by the document.
  for (const auto& arc : arcs) {
    Target t{Target::Kind::box, topo_of[arc.to_box], arc.to_port};
    if (arc.from.kind == Source::Kind::input) def->input_targets[arc.from.index].push_back(t);
    else def->boxes[topo_of[arc.from.index]].targets[arc.from.port].push_back(t);
  }
  for (size_t i = 0; i < outs.size(); ++i)
    def->boxes[topo_of[outs[i].box]].targets[outs[i].port].push_back(Target{Target::Kind::output, uint32_t(i), 0});
  return std::shared_ptr<const NetworkDef>(std::move(def));
}

}  // namespace entente::engine::detail
