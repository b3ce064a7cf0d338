#include "tests/integration/support/contracts.h"

#include <gtest/gtest.h>

#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace entente::testing {

int64_t seconds_from_now(int64_t s) {
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  return (now / 1000 + s) * 1000;
}

std::string stream_terms(int64_t price, int64_t from_ms, int64_t until_ms, const std::string& fields,
                         const std::string& extra) {
  return R"({"kind":"stream","provider":"acme","consumer":"beta","streams":["bids"],"fields":)" + fields +
         R"(,"price_per_million":)" + std::to_string(price) + R"(,"valid_from":)" + std::to_string(from_ms) +
         R"(,"valid_until":)" + std::to_string(until_ms) + (extra.empty() ? "" : "," + extra) + "}";
}

ContractView parse_contract(unsigned status, const std::string& body) {
  ContractView v;
  v.status = status;
  v.body = body;
  rapidjson::Document d;
  d.Parse(body.c_str());
  if (d.HasParseError() || !d.IsObject()) return v;
  if (d.HasMember("id") && d["id"].IsString()) v.id = d["id"].GetString();
  if (d.HasMember("state") && d["state"].IsString()) v.state = d["state"].GetString();
  if (d.HasMember("version") && d["version"].IsUint64()) v.version = d["version"].GetUint64();
  if (d.HasMember("in_force") && d["in_force"].IsBool()) v.in_force = d["in_force"].GetBool();
  if (d.HasMember("history") && d["history"].IsArray()) {
    rapidjson::StringBuffer sb;
    rapidjson::Writer<rapidjson::StringBuffer> w(sb);
    d["history"].Accept(w);
    v.history = sb.GetString();
    for (const auto& h : d["history"].GetArray()) {
      if (h.IsObject() && h.HasMember("state") && h["state"].IsString()) v.states.push_back(h["state"].GetString());
      if (h.IsObject() && h.HasMember("signatures") && h["signatures"].IsArray())
        v.last_signatures = h["signatures"].Size();
    }
  }
  return v;
}

ContractView get_contract(const FedNode& n, const std::string& id, const std::string& token) {
  auto r = n.process().request("GET", "/v1/contracts/" + id, "", token);
  return parse_contract(r.status, r.body);
}

ContractView wait_version(const FedNode& n, const std::string& id, uint64_t version,
                          std::chrono::milliseconds timeout) {
  ContractView v;
  eventually(timeout, [&] {
    v = get_contract(n, id);
    return v.status == 200 && v.version >= version;
  });
  return v;
}

ContractView act(const FedNode& n, const std::string& id, const std::string& action, const std::string& body,
                 const std::string& token) {
  auto r = n.process().request("POST", "/v1/contracts/" + id + "/" + action, body, token);
  return parse_contract(r.status, r.body);
}

uint64_t uint_field(const std::string& body, const char* key) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember(key) || !d[key].IsUint64()) return 0;
  return d[key].GetUint64();
}

void TwoDomains::start() {
  acme = &fed.add("acme");
  beta = &fed.add("beta");
  fed.link(*acme, *beta);
  ASSERT_TRUE(fed.start_all()) << fed.last_error();
  ASSERT_NO_FATAL_FAILURE(create_stream(*acme, "bids"));
  ASSERT_NO_FATAL_FAILURE(wait_linked(*acme, *beta));
}

std::string TwoDomains::propose(const std::string& terms) {
  auto r = acme->process().request("POST", "/v1/contracts", "{\"terms\":" + terms + "}");
  EXPECT_EQ(r.status, 201u) << r.body;
  auto v = parse_contract(r.status, r.body);
  EXPECT_EQ(v.state, "proposed") << r.body;
  EXPECT_NE(r.body.find("\"delivered\":true"), std::string::npos) << r.body;
  auto seen = wait_version(*beta, v.id, 1);
  EXPECT_EQ(seen.status, 200u) << "beta never received " << v.id << ": " << seen.body;
  return v.id;
}

std::string TwoDomains::agree(const std::string& terms) {
  const std::string id = propose(terms);
  auto accepted = act(*beta, id, "accept", R"({"version":1})");
  EXPECT_EQ(accepted.status, 200u) << accepted.body;
  auto on_acme = wait_version(*acme, id, 3);
  EXPECT_EQ(on_acme.state, "active") << on_acme.body;
  auto on_beta = wait_version(*beta, id, 3);
  EXPECT_EQ(on_beta.state, "active") << on_beta.body;
  return id;
}

}  // namespace entente::testing
