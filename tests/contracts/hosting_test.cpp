// may_host and may_host_fragment: the hosting checks the fragment-moving
// code calls, on their own.

#include "contracts/hosting.h"

#include <gtest/gtest.h>

#include "fixture.h"

namespace entente::contracts {
namespace {

using testing::Domains;
using testing::hosting_terms;
using testing::kJan2027;
using testing::kJan2028;

class HostingTest : public ::testing::Test {
 protected:
  // A hosting contract: `host` runs `owner`'s boxes, in force from kJan2027.
  std::string add(const Terms& t) {
    const auto& d = Domains::get();
    const auto& host = t.hosting.host == "beta" ? d.beta() : d.gamma();
    Contract c = testing::active_contract(t, host, d.acme());
    testing::record(node_.ledger(), c);
    return c.id;
  }
  Result<HostingGrant> ask(std::string kind, uint64_t load, uint64_t hosted, int64_t now = kJan2027,
                           std::string host = "beta") {
    return may_host(node_.ledger(), HostingRequest{"acme", std::move(host), std::move(kind), load, hosted}, now);
  }

  testing::Node node_;
};

TEST_F(HostingTest, NoContract) {
  auto r = ask("filter", 100, 0, kJan2027, "gamma");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::not_found);
  EXPECT_EQ(r.error().message, "no hosting contract from host gamma for owner acme");
  add(hosting_terms());
  EXPECT_EQ(ask("filter", 100, 0, kJan2027, "gamma").error().code, Errc::not_found);
}

TEST_F(HostingTest, GrantsWithinTheTerms) {
  const std::string id = add(hosting_terms());
  auto r = ask("filter", 300, 700);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->contract_id, id);
  EXPECT_EQ(r->price_min, 10u);
  EXPECT_EQ(r->price_max, 20u);
  EXPECT_EQ(r->max_load, 1000u);
  EXPECT_EQ(r->notice_seconds, 600u);
  EXPECT_EQ(r->valid_until_ms, kJan2028);
}

TEST_F(HostingTest, BoxKindNotInContract) {
  const std::string id = add(hosting_terms());
  auto r = ask("join", 100, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::permission_denied);
  EXPECT_EQ(r.error().message, "box kind 'join' is not in contract " + id);
}

TEST_F(HostingTest, LoadOverTheMaximum) {
  const std::string id = add(hosting_terms());
  auto r = ask("filter", 300, 800);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::permission_denied);
  EXPECT_EQ(r.error().message, "load 300 + 800 hosted exceeds contract " + id + "'s maximum 1000 CPU ms/s");
}

TEST_F(HostingTest, NotInForce) {
  const std::string id = add(hosting_terms());
  auto early = ask("filter", 100, 0, kJan2027 - 1);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.error().message, "contract " + id + " is not in force (starts 2027-01-01T00:00:00Z)");
  EXPECT_EQ(ask("filter", 100, 0, kJan2028).error().message,
            "contract " + id + " is not in force (expired at 2028-01-01T00:00:00Z)");
  Contract c = *node_.ledger().get(id);
  ASSERT_TRUE(node_.ledger().append(id, *revoke(c, "beta", 3, "maintenance", 10)).ok());
  EXPECT_EQ(ask("filter", 100, 0).error().message,
            "contract " + id + " is not in force (revoked by beta: maintenance)");
}

TEST_F(HostingTest, ProposalIsNotEnough) {
  Contract c{new_contract_id(), {}};
  ASSERT_TRUE(apply(c, *propose("acme", hosting_terms(), 1), "acme", Domains::get().trust()).ok());
  testing::record(node_.ledger(), c);
  EXPECT_EQ(ask("filter", 1, 0).error().message, "contract " + c.id + " is not in force (proposed, not active)");
}

TEST_F(HostingTest, CheapestPermittingContractFirst) {
  Terms pricey = hosting_terms();
  pricey.hosting.price_min = 50;
  pricey.hosting.price_max = 60;
  pricey.hosting.box_kinds = {"filter", "join"};
  pricey.hosting.max_load = 5000;
  Terms cheap = hosting_terms();
  cheap.hosting.price_min = 5;
  cheap.hosting.price_max = 8;
  const std::string pricey_id = add(pricey);
  const std::string cheap_id = add(cheap);
  add(hosting_terms());  // price 10..20
  EXPECT_EQ(ask("filter", 100, 0)->contract_id, cheap_id);
  // Only the pricey one takes joins, or this much load.
  EXPECT_EQ(ask("join", 100, 0)->contract_id, pricey_id);
  EXPECT_EQ(ask("filter", 2000, 1000)->contract_id, pricey_id);
  auto none = ask("filter", 4000, 1500);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().message, "load 4000 + 1500 hosted exceeds contract " + cheap_id + "'s maximum 1000 CPU ms/s");
}

TEST_F(HostingTest, MalformedRequests) {
  add(hosting_terms());
  EXPECT_EQ(ask("filter", 0, 0).error().code, Errc::invalid_argument);
  EXPECT_EQ(ask("filter", 2'000'000, 0).error().code, Errc::invalid_argument);
  EXPECT_EQ(ask("", 10, 0).error().code, Errc::invalid_argument);
  EXPECT_EQ(ask("filter", 10, 0, kJan2027, "Beta!").error().code, Errc::invalid_argument);
}

// A fragment runs under one contract that permits all of its kinds.
class FragmentHostingTest : public HostingTest {
 protected:
  Result<HostingGrant> ask_fragment(std::vector<std::string> kinds, uint64_t load, uint64_t hosted = 0) {
    return may_host_fragment(node_.ledger(), FragmentHostingRequest{"acme", "beta", std::move(kinds), load, hosted},
                             kJan2027);
  }
  Terms with(std::vector<std::string> kinds, uint64_t price, uint64_t max_load = 1000) {
    Terms t = hosting_terms();
    t.hosting.box_kinds = std::move(kinds);
    t.hosting.price_min = price;
    t.hosting.price_max = price;
    t.hosting.max_load = max_load;
    return t;
  }
};

TEST_F(FragmentHostingTest, TheCheapestContractPermittingEveryKind) {
  add(with({"filter"}, 1));
  add(with({"join"}, 2));
  const std::string both = add(with({"filter", "join", "map"}, 30));
  add(with({"filter", "join"}, 20, 100));  // cheaper, but too small
  auto r = ask_fragment({"join", "filter", "join"}, 300, 200);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->contract_id, both);
  EXPECT_EQ(r->price_min, 30u);
  // Each kind alone goes to its cheapest.
  EXPECT_NE(ask_fragment({"filter"}, 300)->contract_id, both);
}

TEST_F(FragmentHostingTest, NoOneContractPermitsEveryKind) {
  add(with({"filter"}, 1));
  add(with({"join"}, 2));
  auto r = ask_fragment({"join", "filter"}, 10);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::permission_denied);
  EXPECT_EQ(r.error().message,
            "no one hosting contract from host beta for owner acme permits every box kind of the fragment "
            "(filter, join)");
}

TEST_F(FragmentHostingTest, TheFirstKindRefusedSaysWhy) {
  const std::string id = add(with({"aggregate", "filter"}, 1));
  auto kind = ask_fragment({"filter", "map", "join"}, 10);
  ASSERT_FALSE(kind.ok());
  EXPECT_EQ(kind.error().message, "box kind 'map' is not in contract " + id);
  auto load = ask_fragment({"filter", "aggregate"}, 900, 200);
  ASSERT_FALSE(load.ok());
  EXPECT_EQ(load.error().message, "load 900 + 200 hosted exceeds contract " + id + "'s maximum 1000 CPU ms/s");
  EXPECT_EQ(ask_fragment({}, 10).error().code, Errc::invalid_argument);
  EXPECT_EQ(ask_fragment({"filter"}, 0).error().code, Errc::invalid_argument);
}

}  // namespace
}  // namespace entente::contracts
