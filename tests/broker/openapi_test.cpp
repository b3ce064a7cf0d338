// The OpenAPI description (docs/api/openapi.yaml, served at
// /v1/openapi.json) and the routes the node serves must be the same set.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>

#include "broker/detail/node_impl.h"
#include "rapidjson/document.h"

namespace entente::broker {
std::string_view openapi_json();
}

namespace entente::broker::detail {
namespace {

TEST(OpenApi, DescribesExactlyTheRoutesServed) {
  rapidjson::Document d;
  auto text = openapi_json();
  d.Parse(text.data(), text.size());
  ASSERT_FALSE(d.HasParseError());
  ASSERT_TRUE(d.HasMember("paths"));
  std::set<std::string> documented;
  for (auto p = d["paths"].MemberBegin(); p != d["paths"].MemberEnd(); ++p) {
    for (auto m = p->value.MemberBegin(); m != p->value.MemberEnd(); ++m) {
      std::string method = m->name.GetString();
      static const std::set<std::string> kMethods = {"get", "post", "put", "delete", "patch", "head", "options"};
      if (!kMethods.count(method)) continue;  // "parameters", "summary", ...
      std::transform(method.begin(), method.end(), method.begin(), ::toupper);
      documented.insert(method + " " + p->name.GetString());
    }
  }
  std::set<std::string> served;
  for (const auto& r : api_routes()) served.insert(std::string(r.method) + " " + r.path);
  for (const auto& s : served) EXPECT_TRUE(documented.count(s)) << s << " is served but not in openapi.yaml";
  for (const auto& s : documented) EXPECT_TRUE(served.count(s)) << s << " is in openapi.yaml but not served";
}

TEST(OpenApi, EveryOperationDocumentsItsErrorsAsProblems) {
  rapidjson::Document d;
  auto text = openapi_json();
  d.Parse(text.data(), text.size());
  ASSERT_TRUE(d.IsObject());
  EXPECT_EQ(std::string(d["openapi"].GetString()).rfind("3.", 0), 0u);
  EXPECT_NE(std::string(text).find("application/problem+json"), std::string::npos);
}

// The table also drives authorisation: these are the access rules of
// docs/api.md (health, the description and the dashboard's files public;
// reading a reader's; publishing a publisher's; every change an admin's;
// a dashboard session any token's, docs/dashboard.md).
TEST(OpenApiRoutes, EachRouteNeedsTheRoleOfItsAccessRule) {
  for (const auto& r : api_routes()) {
    const std::string key = std::string(r.method) + " " + r.path;
    std::optional<Role> want = Role::admin;
    if (key == "GET /v1/health" || key == "GET /v1/openapi.json" || key == "GET /ui" || key == "GET /ui/{file}" ||
        key == "DELETE /v1/ui/session")
      want = std::nullopt;
    else if (key == "POST /v1/ui/session") want = Role::reader;  // any token: the session reads with its role
    else if (key == "POST /v1/streams/{name}/tuples" || key == "GET /v1/streams/{name}/publish")
      want = Role::publisher;
    else if (std::string_view(r.method) == "GET") want = Role::reader;
    EXPECT_EQ(r.role, want) << key;
    // WebSocket routes are served by the upgrade, every other by its handler.
    EXPECT_EQ(r.handler == nullptr, r.websocket) << key;
    if (r.websocket) {
      EXPECT_STREQ(r.method, "GET") << key;
    }
  }
}

TEST(OpenApiRoutes, MatchDecodesParamsAndListsEveryMethodOfThePath) {
  PathParams params;
  auto routes = match_routes("/v1/imports/acme/a%2Fb", params);
  ASSERT_EQ(routes.size(), 2u);
  EXPECT_STREQ(routes[0]->path, "/v1/imports/{domain}/{name}");
  EXPECT_STREQ(routes[0]->method, "GET");
  EXPECT_STREQ(routes[1]->method, "DELETE");
  EXPECT_EQ(params, (PathParams{"acme", "a/b"}));

  params.clear();
  routes = match_routes("/v1/streams/acme%2Fbids/tuples", params);
  ASSERT_EQ(routes.size(), 1u);
  EXPECT_STREQ(routes[0]->path, "/v1/streams/{name}/tuples");
  EXPECT_EQ(params, (PathParams{"acme/bids"}));

  // A literal segment is never decoded: "streams%2Fx" is no route.
  EXPECT_TRUE(match_routes("/v1/streams%2Fx", params).empty());
  EXPECT_TRUE(match_routes("/v1/streams/x/nothing", params).empty());
  EXPECT_TRUE(match_routes("/v2/streams", params).empty());
  EXPECT_TRUE(match_routes("/", params).empty());
  ASSERT_EQ(match_routes("/metrics", params).size(), 1u);
  EXPECT_EQ(match_routes("/v1/contracts", params).size(), 2u);
}

}  // namespace
}  // namespace entente::broker::detail
