#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// What the two halves of a hosted run share (cluster_hosted.cpp, the run;
// cluster_hosted_warm.cpp, its warm standby on the host): the calls to the
// host over federation::Hosting, their bounds, the names of a run's hidden
// streams, and the readers of a call's JSON members.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/result.h"
#include "broker/detail/json_out.h"
#include "certs/certs.h"
#include "engine/network.h"
#include "federation/hosting.h"
#include "rapidjson/document.h"

namespace entente::broker::detail::hosted {

using Clock = std::chrono::steady_clock;

inline constexpr auto kCallWait = std::chrono::seconds(30);
inline constexpr auto kEndWait = std::chrono::seconds(5);
// Hosted runs and standbys on one node, at most.
inline constexpr size_t kMaxHostedHere = 32;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// A hidden stream's name on the host: stable for the owner's runner,
// short, a valid stream name ([a-z][a-z0-9_-]*).
inline std::string hidden_name(const std::string& key, const std::string& suffix) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out = "hosted-";
  for (int i = 15; i >= 0; --i) out.push_back(kDigits[(h >> (4 * i)) & 15]);
  return out + "-" + suffix;
}

// The members of a JsonOut object, without its braces (Hosting::call's
// `fields`).
inline std::string members_of(std::string object) {
  return object.size() < 2 ? "" : object.substr(1, object.size() - 2);
}

// A call to the host, waited for (on the hosted thread): the answer's body
// or why not. Hosting expires calls, so the wait is bounded.
inline Result<std::string> call_host(federation::Hosting& hosting, const certs::Identity& host,
                                     const std::string& type, const std::string& fields,
                                     std::chrono::milliseconds wait) {
  auto p = std::make_shared<std::promise<Result<std::string>>>();
  auto f = p->get_future();
  hosting.call(host, type, fields, [p](Result<std::string> r) { p->set_value(std::move(r)); }, wait);
  return f.get();
}

// hosting.end for the run of `fragment` of `query` on `host` (`release`:
// its streams and copies go too): the answer's body, or why not.
inline Result<std::string> end_host_run(federation::Hosting& hosting, const certs::Identity& host,
                                        const std::string& query, const std::string& fragment, bool release) {
  JsonOut e;
  e.begin_object().key("query").str(query).key("fragment").str(fragment).key("release").boolean(release);
  return call_host(hosting, host, "hosting.end", members_of(e.end_object().take()), kEndWait);
}

inline std::vector<uint64_t> u64s(const rapidjson::Value& o, const char* key) {
  std::vector<uint64_t> out;
  if (!o.HasMember(key) || !o[key].IsArray()) return out;
  for (const auto& v : o[key].GetArray())
    if (v.IsUint64()) out.push_back(v.GetUint64());
  return out;
}

inline std::string str_of(const rapidjson::Value& o, const char* key) {
  return o.HasMember(key) && o[key].IsString() ? std::string(o[key].GetString(), o[key].GetStringLength())
                                               : std::string();
}

inline uint64_t u64_of(const rapidjson::Value& o, const char* key) {
  return o.HasMember(key) && o[key].IsUint64() ? o[key].GetUint64() : 0;
}

// The fragment a hosting.warm or hosting.run call carries, checked as the
// host checks it: its contract, with the host's own ledger
// (`hosting`.check), and its network, with the host's own engine.
struct Definition {
  std::string network_json;
  std::optional<engine::QueryNetwork> net;
  std::set<std::string> reads, writes;  // the internal streams it reads and writes
  std::string contract;                 // the contract it runs under
};
// The call's "body" and "load" read and checked; an error's message is the
// refusal's reason.
Result<Definition> read_definition(federation::Hosting& hosting, const std::string& owner_domain,
                                   const rapidjson::Value& call, const std::string& query,
                                   const std::string& fragment);

}  // namespace entente::broker::detail::hosted
