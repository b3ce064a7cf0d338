// Metering (federation/metering.h) over a real store and contracts ledger:
// a stream contract is charged for what the consumer acknowledged, each
// tuple once, also across a restart of the owner.
#include "federation/metering.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/contracts/fixture.h"

namespace entente::federation {
namespace {

using contracts::testing::Domains;
using Node = contracts::testing::Node;

class MeteringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto& d = Domains::get();
    auto c = contracts::testing::active_contract(contracts::testing::stream_terms(), d.acme(), d.beta());
    contracts::testing::record(node_.ledger(), c);
    contract_ = c.id;
    open();
  }
  // (Re)opens the metering over the node's store, as a start does.
  void open() {
    metering_ = std::make_unique<Metering>(node_.store(), [this](const std::string& l) { log_.push_back(l); });
    metering_->set_ledger(&node_.ledger());
    ASSERT_TRUE(metering_->load().ok());
  }
  uint64_t charged() {
    auto u = node_.ledger().usage(contract_);
    return u.ok() ? u->tuples : 0;
  }
  using Ranges = std::map<uint64_t, std::pair<uint64_t, uint64_t>>;

  Node node_;
  std::string contract_;
  std::unique_ptr<Metering> metering_;
  std::vector<std::string> log_;
};

TEST_F(MeteringTest, OnlyWhatWasAcknowledgedIsChargedAndEachTupleOnce) {
  metering_->note_sent("bids", "beta", contract_, 1, 100, 100);
  metering_->note_sent("bids", "beta", contract_, 101, 200, 50);  // half filtered out
  metering_->note_sent("bids", "beta", contract_, 201, 300, 100);
  metering_->charge_through("bids", "beta", 150, false);  // inside the second range
  EXPECT_EQ(charged(), 100u);
  EXPECT_EQ(metering_->unbilled("bids", "beta"), (Ranges{{101, {200, 50}}, {201, {300, 100}}}));
  metering_->charge_through("bids", "beta", 150, false);  // the same ACK again
  EXPECT_EQ(charged(), 100u);
  metering_->charge_through("bids", "beta", 300, false);
  EXPECT_EQ(charged(), 250u);
  EXPECT_TRUE(metering_->unbilled("bids", "beta").empty());
  EXPECT_TRUE(log_.empty());
}

TEST_F(MeteringTest, ARangeSentAgainReplacesWhatItOverlaps) {
  metering_->note_sent("bids", "beta", contract_, 1, 100, 100);
  // The link refused the frame; the sender split it and sent the first half.
  metering_->note_sent("bids", "beta", contract_, 1, 50, 50);
  EXPECT_EQ(metering_->unbilled("bids", "beta"), (Ranges{{1, {50, 50}}}));
  metering_->charge_through("bids", "beta", 100, false);
  EXPECT_EQ(charged(), 50u);
}

TEST_F(MeteringTest, RangesNotedBeforeARestartAreChargedAfterIt) {
  metering_->note_sent("bids", "beta", contract_, 1, 100, 100);
  metering_->note_sent("bids", "beta", contract_, 101, 200, 100);
  metering_.reset();
  node_.reopen();
  open();
  EXPECT_EQ(metering_->unbilled("bids", "beta"), (Ranges{{1, {100, 100}}, {101, {200, 100}}}));
  // An OPEN from 101: the consumer holds 1..100, and 101.. is sent again.
  metering_->charge_through("bids", "beta", 100, true);
  EXPECT_EQ(charged(), 100u);
  EXPECT_TRUE(metering_->unbilled("bids", "beta").empty());
  metering_.reset();
  node_.reopen();
  open();
  EXPECT_TRUE(metering_->unbilled("bids", "beta").empty());
  EXPECT_EQ(charged(), 100u);
}

}  // namespace
}  // namespace entente::federation
