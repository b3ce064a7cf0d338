#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// What a node asking the other nodes of its domain on a user's behalf
// builds and reads (cluster_fragments.cpp, cluster_lifecycle.cpp,
// cluster_splits.cpp): the request with the user's credentials, a
// fragment's path, the reason in a problem answer, a 503 to retry.

#include <string>

#include "http/server.h"
#include "rapidjson/document.h"

namespace entente::broker::detail::node_calls {

// A request to another node made from the user's `req` (its credentials),
// as a first hop whatever `req` was.
inline http::Request sub_request(const http::Request& req, std::string method, std::string target,
                                 std::string body) {
  http::Request sub;
  sub.method = std::move(method);
  sub.target = target;
  sub.path = std::move(target);
  sub.remote = req.remote;
  for (const auto& h : req.headers)
    if (h.first == "authorization") sub.headers.push_back(h);
  if (!body.empty()) {
    sub.headers.emplace_back("content-type", "application/json");
    sub.content_type = "application/json";
  }
  sub.body = std::move(body);
  return sub;
}

inline std::string fragment_target(const std::string& query, const std::string& fragment) {
  return "/v1/queries/" + query + "/fragments/" + fragment;
}

// The "detail" of a problem answer, else the start of its body.
inline std::string detail_of(const http::Response& r) {
  rapidjson::Document d;
  d.Parse(r.body.data(), r.body.size());
  if (!d.HasParseError() && d.IsObject() && d.HasMember("detail") && d["detail"].IsString())
    return d["detail"].GetString();
  return r.body.substr(0, 300);
}

inline bool success(const http::Response& r) { return r.status >= 200 && r.status < 300; }

// 503 with Retry-After: 1.
inline http::Response unavailable(std::string detail) {
  http::Response r = http::Response::problem(503, "Service Unavailable", std::move(detail));
  r.headers.emplace_back("Retry-After", "1");
  return r;
}

}  // namespace entente::broker::detail::node_calls
