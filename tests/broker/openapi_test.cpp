// The OpenAPI description (docs/api/openapi.yaml, served at
// /v1/openapi.json) and the routes the node serves must be the same set.
#include <gtest/gtest.h>

#include <algorithm>
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

}  // namespace
}  // namespace entente::broker::detail
