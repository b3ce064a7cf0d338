#include "tests/integration/support/ws_reader.h"

#include <chrono>

#include "rapidjson/document.h"

namespace entente::testing {

std::vector<Tuple> parse_lines(const std::string& ndjson) {
  std::vector<Tuple> out;
  size_t start = 0;
  while (start < ndjson.size()) {
    size_t end = ndjson.find('\n', start);
    if (end == std::string::npos) end = ndjson.size();
    std::string line = ndjson.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    rapidjson::Document d;
    d.Parse(line.c_str());
    Tuple t;
    if (!d.HasParseError() && d.IsObject() && d.HasMember("_seq") && d["_seq"].IsUint64()) t.seq = d["_seq"].GetUint64();
    t.line = std::move(line);
    out.push_back(std::move(t));
  }
  return out;
}

ReadResult read_stream(const BrokerProcess& broker, const std::string& stream, uint64_t from, uint64_t until_seq,
                       int64_t timeout_ms) {
  ReadResult res;
  auto ws = http::WsClient::connect(broker.client_options(),
                                            "/v1/streams/" + stream + "/subscribe?from=" + std::to_string(from),
                                            {{"authorization", std::string("Bearer ") + kReaderToken}});
  if (!ws.ok()) {
    res.error = ws.error().message;
    return res;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  uint64_t last = from == 0 ? 0 : from - 1;
  while (last < until_seq && std::chrono::steady_clock::now() < deadline) {
    auto m = (*ws)->receive(200);
    if (!m.ok()) {
      if (m.error().code == Errc::unavailable) continue;
      res.error = m.error().message;
      break;
    }
    if (m->closed) {
      res.closed = true;
      res.close_code = m->close_code;
      res.close_reason = m->close_reason;
      break;
    }
    auto lines = parse_lines(m->data);
    if (!lines.empty()) last = lines.back().seq;
    for (auto& t : lines) res.tuples.push_back(t);
    res.frames.push_back(std::move(lines));
  }
  (void)(*ws)->close();
  return res;
}

uint64_t next_seq(const BrokerProcess& broker, const std::string& stream) {
  auto r = broker.request("GET", "/v1/streams/" + stream, "", kReaderToken);
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("next_seq")) return 0;
  return d["next_seq"].GetUint64();
}

}  // namespace entente::testing
