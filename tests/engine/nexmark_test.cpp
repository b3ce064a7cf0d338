// NEXMark on a small number of events: the generator follows its
// specification and is deterministic, for every query the engine's output
// equals the hand-written reference's, row for row, and queries cut into
// fragments (engine/fragments.h) give the whole query's output.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "bench/nexmark/generator.h"
#include "bench/nexmark/reference.h"
#include "bench/nexmark/runner.h"
#include "engine/fragments.h"
#include "tests/engine/fragment_chain.h"

namespace entente::nexmark {
namespace {

using engine::Type;

// 32 s of event time at 10,000 events/s: several 10 s windows, and many
// slides of q5's 2 s.
constexpr uint64_t kEvents = 320'000;

const Events& small_events() {
  static const Events ev = [] {
    GeneratorConfig c;
    c.events = kEvents;
    c.chunk_events = 4096;
    auto r = generate(c);
    EXPECT_TRUE(r.ok());
    return std::move(r).value();
  }();
  return ev;
}

Batch concat_stream(const Events& ev, Batch Chunk::*stream, const SchemaPtr& schema) {
  std::vector<Batch> parts;
  for (const Chunk& c : ev.chunks) parts.push_back(c.*stream);
  return engine::concat(schema, parts);
}

TEST(NexmarkGenerator, RefusesBadConfigs) {
  GeneratorConfig c;
  EXPECT_TRUE(c.validate().ok());
  c.chunk_events = 0;
  EXPECT_FALSE(c.validate().ok());
  c = GeneratorConfig{};
  c.events = (uint64_t{1} << 34) + 1;
  EXPECT_FALSE(c.validate().ok());
  c = GeneratorConfig{};
  c.hot_bidders_ratio = 0;
  EXPECT_FALSE(c.validate().ok());
  c = GeneratorConfig{};
  c.inter_event_delay_us = 0;
  EXPECT_FALSE(c.validate().ok());
  c = GeneratorConfig{};
  c.avg_bid_bytes = 2'000'000;
  auto r = generate(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::invalid_argument);
}

TEST(NexmarkGenerator, ProportionsIdsAndTimes) {
  const Events& ev = small_events();
  EXPECT_EQ(ev.total(), kEvents);
  EXPECT_EQ(ev.persons, kEvents / 50);
  EXPECT_EQ(ev.auctions, kEvents / 50 * 3);
  EXPECT_EQ(ev.bids, kEvents / 50 * 46);
  const Batch p = concat_stream(ev, &Chunk::persons, person_schema());
  const Batch a = concat_stream(ev, &Chunk::auctions, auction_schema());
  const Batch b = concat_stream(ev, &Chunk::bids, bid_schema());
  ASSERT_TRUE(p.validate().ok());
  ASSERT_TRUE(a.validate().ok());
  ASSERT_TRUE(b.validate().ok());
  const GeneratorConfig cfg;
  // Event n is a person when n % 50 == 0: person k is event 50k.
  for (size_t k = 0; k < p.rows(); ++k) {
    ASSERT_EQ(p.column(kPId).ints[k], kFirstPersonId + static_cast<int64_t>(k));
    ASSERT_EQ(p.event_time[k], cfg.base_time_ms + static_cast<int64_t>(50 * k / 10));
    ASSERT_EQ(p.column(kPDateTime).ints[k], p.event_time[k]);
    ASSERT_EQ(p.seq[k], k);
  }
  for (size_t k = 0; k < a.rows(); ++k) {
    ASSERT_EQ(a.column(kAId).ints[k], kFirstAuctionId + static_cast<int64_t>(k));
    ASSERT_EQ(a.seq[k], k);
  }
  for (size_t k = 0; k + 1 < b.rows(); ++k) {
    ASSERT_LE(b.event_time[k], b.event_time[k + 1]);
    ASSERT_EQ(b.seq[k], k);
  }
}

TEST(NexmarkGenerator, FieldDomains) {
  const Events& ev = small_events();
  const std::set<std::string_view> states = {"AZ", "CA", "ID", "OR", "WA", "WY"};
  uint64_t hot_auction_bids = 0;
  for (const Chunk& ch : ev.chunks) {
    const Batch& p = ch.persons;
    for (size_t i = 0; i < p.rows(); ++i) {
      ASSERT_TRUE(states.count(p.column(kPState).str(i))) << p.column(kPState).str(i);
      ASSERT_EQ(p.column(kPCreditCard).str(i).size(), 19u);
      ASSERT_NE(p.column(kPEmail).str(i).find('@'), std::string_view::npos);
      ASSERT_NE(p.column(kPName).str(i).find(' '), std::string_view::npos);
    }
    const Batch& a = ch.auctions;
    for (size_t i = 0; i < a.rows(); ++i) {
      const int64_t cat = a.column(kACategory).ints[i];
      ASSERT_GE(cat, 10);
      ASSERT_LE(cat, 14);
      const int64_t initial = a.column(kAInitialBid).ints[i];
      ASSERT_GE(initial, 100);
      ASSERT_LE(initial, 100'000'000);
      ASSERT_GT(a.column(kAReserve).ints[i], initial);
      const int64_t len = a.column(kAExpires).ints[i] - a.column(kADateTime).ints[i];
      // Beam: 1 + uniform below twice the time of 100 auctions (~166.7 ms).
      ASSERT_GE(len, 1);
      ASSERT_LE(len, 336);
      // Padded towards 500 bytes on average.
      const size_t size = 8 + a.column(kAItemName).str(i).size() + a.column(kADescription).str(i).size() +
                          40 + a.column(kAExtra).str(i).size();
      ASSERT_GE(size, 350u);
      ASSERT_LE(size, 650u);
      ASSERT_LE(a.column(kASeller).ints[i], kFirstPersonId + static_cast<int64_t>(ev.persons) + 10);
    }
    const Batch& b = ch.bids;
    for (size_t i = 0; i < b.rows(); ++i) {
      const int64_t price = b.column(kBPrice).ints[i];
      ASSERT_GE(price, 100);
      ASSERT_LE(price, 100'000'000);
      const size_t extra = b.column(kBExtra).str(i).size();
      ASSERT_GE(extra, 54u);  // 68 +- 20%
      ASSERT_LE(extra, 82u);
      ASSERT_EQ(b.column(kBUrl).str(i).rfind("https://www.nexmark.com/", 0), 0u);
      if ((b.column(kBAuction).ints[i] - kFirstAuctionId) % 100 == 0) ++hot_auction_bids;
    }
  }
  // Half the bids go to the current hot auction (hot_auction_ratio 2).
  EXPECT_GT(hot_auction_bids, ev.bids * 45 / 100);
  EXPECT_LT(hot_auction_bids, ev.bids * 56 / 100);
}

TEST(NexmarkGenerator, DeterministicAndIndependentOfChunking) {
  GeneratorConfig c;
  c.events = 20'000;
  c.chunk_events = 777;
  auto a = generate(c);
  c.chunk_events = 8192;
  auto b = generate(c);
  c.seed = 2;
  auto other = generate(c);
  ASSERT_TRUE(a.ok() && b.ok() && other.ok());
  for (auto [stream, schema] :
       {std::pair{&Chunk::persons, person_schema()}, std::pair{&Chunk::auctions, auction_schema()},
        std::pair{&Chunk::bids, bid_schema()}}) {
    const Batch x = concat_stream(*a, stream, schema);
    const Batch y = concat_stream(*b, stream, schema);
    EXPECT_TRUE(x == y);
    EXPECT_FALSE(x == concat_stream(*other, stream, schema));
  }
}

class NexmarkQuery : public ::testing::TestWithParam<std::string> {};

TEST_P(NexmarkQuery, EngineEqualsReference) {
  auto run = run_query(GetParam(), small_events(), RunOptions{});
  ASSERT_TRUE(run.ok()) << run.error().message;
  EXPECT_TRUE(run->results_match) << run->mismatch;
  EXPECT_GT(run->output_rows, 0u);
  EXPECT_EQ(run->output_rows, run->reference_rows);
  EXPECT_EQ(run->events, kEvents);
}

INSTANTIATE_TEST_SUITE_P(All, NexmarkQuery, ::testing::Values("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8"),
                         [](const auto& info) { return info.param; });

TEST(NexmarkQueries, EveryQueryHasAReference) {
  EXPECT_EQ(query_names().size(), 8u);
  for (auto q : query_names()) EXPECT_NE(find_reference(q), nullptr) << q;
  EXPECT_EQ(find_reference("q6"), nullptr);
}

// Small chunks: windows and joins see their rows spread over many batches
// and watermarks; the output must not change.
TEST(NexmarkQueries, SmallChunksGiveTheSameResults) {
  GeneratorConfig c;
  c.events = 120'000;
  c.chunk_events = 333;
  auto ev = generate(c);
  ASSERT_TRUE(ev.ok());
  for (const char* q : {"q3", "q4", "q5", "q7", "q8"}) {
    auto run = run_query(q, *ev, RunOptions{});
    ASSERT_TRUE(run.ok()) << q << ": " << run.error().message;
    EXPECT_TRUE(run->results_match) << q << ": " << run->mismatch;
  }
}

TEST(NexmarkRunner, KeepsOutputWhenAsked) {
  RunOptions o;
  o.keep_output = true;
  auto run = run_query("q2", small_events(), o);
  ASSERT_TRUE(run.ok());
  uint64_t rows = 0;
  for (const Batch& b : run->output) {
    rows += b.rows();
    for (size_t i = 0; i < b.rows(); ++i) ASSERT_EQ(b.column(0).ints[i] % 123, 0);
  }
  EXPECT_EQ(rows, run->output_rows);
}

TEST(NexmarkRunner, CompareFindsTheFirstDifference) {
  const RefOutput ref = find_reference("q2")(small_events());
  auto run = run_query("q2", small_events(), RunOptions{.keep_output = true});
  ASSERT_TRUE(run.ok());
  ASSERT_GT(ref.rows(), 3u);
  EXPECT_EQ(compare_outputs(run->output, ref), "");

  RefOutput changed = ref;
  changed.columns[1].ints[2] += 1;
  EXPECT_NE(compare_outputs(run->output, changed).find("row 2 field 'price'"), std::string::npos);

  changed = ref;
  changed.event_time[3] += 1;
  EXPECT_NE(compare_outputs(run->output, changed).find("row 3 event time"), std::string::npos);

  changed = ref;
  changed.event_time.pop_back();
  for (auto& c : changed.columns) c.ints.pop_back();
  EXPECT_NE(compare_outputs(run->output, changed).find("rows"), std::string::npos);

  RefOutput renamed = ref;
  renamed.schema = engine::make_schema({{"auction", Type::Int64}, {"cost", Type::Int64}});
  EXPECT_NE(compare_outputs(run->output, renamed).find("schema"), std::string::npos);
}

TEST(NexmarkRunner, RefusesBadQueries) {
  GeneratorConfig c;
  c.events = 1000;
  auto ev = generate(c);
  ASSERT_TRUE(ev.ok());

  auto unknown = run_query("q6", *ev, RunOptions{});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code, Errc::not_found);

  auto bad_name = load_query_text("../q0", ENTENTE_NEXMARK_QUERY_DIR);
  ASSERT_FALSE(bad_name.ok());
  EXPECT_EQ(bad_name.error().code, Errc::invalid_argument);

  const auto dir = std::filesystem::temp_directory_path() /
                   ("nexmark_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  std::filesystem::create_directories(dir);
  RunOptions o;
  o.query_dir = dir.string();
  auto missing = run_query("q1", *ev, o);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, Errc::not_found);

  // A network that does not validate: the error carries the diagnostics.
  std::ofstream(dir / "q1.json")
      << R"({"name": "broken", "inputs": [], "boxes": [{"id": "m", "type": "nosuch"}],
                                       "arcs": [], "outputs": []})";
  auto invalid = run_query("q1", *ev, o);
  ASSERT_FALSE(invalid.ok());
  EXPECT_EQ(invalid.error().code, Errc::invalid_argument);
  EXPECT_NE(invalid.error().message.find("$.boxes[0]"), std::string::npos) << invalid.error().message;

  // A valid network over an input the benchmark cannot feed.
  auto text = load_query_text("q2", ENTENTE_NEXMARK_QUERY_DIR);
  ASSERT_TRUE(text.ok());
  std::string renamed = *text;
  for (size_t at; (at = renamed.find("\"bids\"")) != std::string::npos;) renamed.replace(at, 6, "\"offers\"");
  std::ofstream(dir / "q2.json") << renamed;
  auto unfed = run_query("q2", *ev, o);
  ASSERT_FALSE(unfed.ok());
  EXPECT_NE(unfed.error().message.find("offers"), std::string::npos) << unfed.error().message;
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------
// Queries cut into fragments, each run by its own executor and chained as
// the broker chains them across nodes (tests/engine/fragment_chain.h), give
// the whole query's output row for row, and as many rows after each push.

struct CutCase {
  std::string query;
  std::vector<engine::FragmentSpec> fragments;
};

void PrintTo(const CutCase& c, std::ostream* os) {
  *os << c.query << " in " << c.fragments.size() << " fragments";
}

class NexmarkCut : public ::testing::TestWithParam<CutCase> {};

TEST_P(NexmarkCut, FragmentsGiveTheWholeQuerysOutput) {
  const CutCase& c = GetParam();
  auto text = load_query_text(c.query, ENTENTE_NEXMARK_QUERY_DIR);
  ASSERT_TRUE(text.ok()) << text.error().message;
  Diagnostics diag;
  auto net = engine::QueryNetwork::parse(*text, diag);
  ASSERT_TRUE(net.ok()) << diag.to_string();
  auto cut = engine::cut_query(*net, c.fragments, diag);
  ASSERT_TRUE(cut.ok()) << diag.to_string();
  ASSERT_EQ(cut->fragments.size(), c.fragments.size());
  EXPECT_FALSE(cut->arcs.empty());
  // In event-time order, chunk by chunk, as the benchmark feeds the query.
  engine::fragment_test::Feed feed;
  for (const Chunk& ch : small_events().chunks) {
    for (const auto& [name, b] : {std::pair{"persons", &ch.persons}, std::pair{"auctions", &ch.auctions},
                                  std::pair{"bids", &ch.bids}}) {
      if (net->input_index(name)) feed.pushes.emplace_back(name, *b);
    }
  }
  engine::fragment_test::expect_same_output(*net, *cut, feed);
}

INSTANTIATE_TEST_SUITE_P(
    Cuts, NexmarkCut,
    ::testing::Values(
        // q5's two boxes apart: the sliding top-k counts, then the map.
        CutCase{"q5", {{"counts", "n1", {"counts"}}, {"hot", "n2", {"hot"}}}},
        // q8: both sides of the join and the join on three nodes ...
        CutCase{"q8", {{"people", "n1", {"people"}}, {"sellers", "n2", {"sellers"}}, {"join", "n3", {"new_users"}}}},
        // ... and one side with the join.
        CutCase{"q8", {{"sellers", "n2", {"sellers"}}, {"rest", "n1", {"new_users", "people"}}}},
        // q3 (filters feeding a join), q4 (join, then two aggregates), q7.
        CutCase{"q3", {{"p", "n1", {"sellers", "local"}}, {"a", "n2", {"items", "cat10"}}, {"j", "n3", {"suggest"}}}},
        CutCase{"q4",
                {{"bids", "n2", {"bid_prices"}},
                 {"join", "n1", {"auction_times", "in_time", "at_expiry"}},
                 {"win", "n3", {"winning", "by_category"}}}},
        CutCase{"q7", {{"max", "n1", {"highest"}}, {"win", "n2", {"winner"}}}}),
    [](const ::testing::TestParamInfo<CutCase>& info) {
      return info.param.query + "_in_" + std::to_string(info.param.fragments.size()) + "_" +
             std::to_string(info.index);
    });

}  // namespace
}  // namespace entente::nexmark
