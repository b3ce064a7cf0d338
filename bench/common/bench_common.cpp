#include "bench/common/bench_common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "engine/codec.h"

namespace entente::bench {

http::ClientOptions client_options(const Node& node) {
  http::ClientOptions o;
  o.host = node.host;
  o.port = node.port;
  o.tls = node.tls;
  o.ca_file = node.ca_file;
  o.timeout_ms = 30000;
  return o;
}

std::vector<std::pair<std::string, std::string>> auth(const Node& node) {
  return {{"authorization", "Bearer " + node.token}};
}

Result<http::ClientResponse> call(const Node& node, const std::string& method, const std::string& target,
                                          const std::string& body) {
  auto c = http::Client::connect(client_options(node));
  if (!c.ok()) return c.error();
  return (*c)->request(method, target, body, "application/json", auth(node));
}

std::string durability_mode(const Node& node) {
  auto r = call(node, "GET", "/metrics");
  if (!r.ok() || r->status != 200) return "unknown";
  const std::string key = "entente_ingest_durability{mode=\"";
  const size_t at = r->body.find(key);
  if (at == std::string::npos) return "unknown";
  const size_t end = r->body.find('"', at + key.size());
  if (end == std::string::npos || end - at - key.size() > 16) return "unknown";
  return r->body.substr(at + key.size(), end - at - key.size());
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* const kSchemaJson =
    R"([{"name":"ts","type":"int64"},{"name":"k","type":"int64"},{"name":"payload","type":"string"}])";

const std::string& payload() {
  static const std::string p(80, 'p');
  return p;
}

engine::SchemaPtr schema() {
  return engine::make_schema({{"ts", engine::Type::Int64}, {"k", engine::Type::Int64}, {"payload", engine::Type::String}});
}

std::string binary_batch(int rows, int64_t base, int64_t ts) {
  engine::BatchBuilder bb(schema());
  bb.reserve(static_cast<size_t>(rows));
  for (int i = 0; i < rows; ++i) {
    bb.column(0).ints.push_back(ts);
    bb.column(1).ints.push_back(base + i);
    bb.column(2).append_str(payload());
    bb.event_time().push_back(0);
    bb.seq().push_back(0);
  }
  std::string out;
  engine::encode_batch(bb.finish(), out);
  return out;
}

bool create_stream(const Node& node, const std::string& name, bool replace, const char* prog) {
  if (replace) (void)call(node, "DELETE", "/v1/streams/" + name);
  auto r = call(node, "POST", "/v1/streams", std::string("{\"name\":\"") + name + "\",\"schema\":" + kSchemaJson + "}");
  if (!r.ok() || r->status != 201) {
    std::fprintf(stderr, "%s: creating stream %s: %s\n", prog, name.c_str(),
                 r.ok() ? r->body.c_str() : r.error().message.c_str());
    return false;
  }
  return true;
}

Percentiles percentiles(std::vector<double>& ms) {
  Percentiles p;
  if (ms.empty()) return p;
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) {
    return ms[std::min(ms.size() - 1, static_cast<size_t>(q * static_cast<double>(ms.size())))];
  };
  p.p50 = at(0.50);
  p.p99 = at(0.99);
  p.p999 = at(0.999);
  p.max = ms.back();
  return p;
}

bool ArgReader::next() {
  if (i_ + 1 >= argc_) return false;
  name_ = argv_[++i_];
  return true;
}

std::string ArgReader::value() {
  if (i_ + 1 >= argc_) {
    std::fprintf(stderr, "%s: %s needs a value\n", prog_, name_.c_str());
    std::exit(2);
  }
  return argv_[++i_];
}

int ArgReader::integer() { return std::atoi(value().c_str()); }
double ArgReader::number() { return std::atof(value().c_str()); }
uint16_t ArgReader::port() { return static_cast<uint16_t>(std::atoi(value().c_str())); }

}  // namespace entente::bench
