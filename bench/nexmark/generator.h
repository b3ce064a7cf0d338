// The NEXMark event generator (persons, auctions, bids), following the
// generator of Apache Beam's and Flink's NEXMark (GeneratorConfig,
// PersonGenerator, AuctionGenerator, BidGenerator, PriceGenerator,
// StringsGenerator): the same proportions, id schemes, hot ratios, price
// distribution, auction lengths and padding, with an own fast PRNG
// (splitmix64, reseeded per event), so that event n is a pure function of
// (seed, n) and chunking does not change any event. docs/nexmark.md
// describes every field.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/batch.h"

namespace entente::nexmark {

using engine::Batch;
using engine::EventTime;
using engine::SchemaPtr;

// Beam's defaults unless noted.
struct GeneratorConfig {
  uint64_t seed = 1;
  uint64_t events = 10'000'000;
  // Event time of event 0. A multiple of 10 s, so that the 10 s windows of
  // q5/q7/q8 start at round times. (Beam uses the wall clock at start.)
  EventTime base_time_ms = 1'500'000'000'000;
  // Beam's default first event rate is 10,000 events/s: 100 us per event,
  // so ten consecutive events share one millisecond.
  uint64_t inter_event_delay_us = 100;
  // 1 in N is *not* hot: Beam draws nextInt(ratio) > 0 for "hot".
  uint32_t hot_auction_ratio = 2;
  uint32_t hot_sellers_ratio = 4;
  uint32_t hot_bidders_ratio = 4;
  uint32_t num_active_people = 1000;
  uint32_t num_in_flight_auctions = 100;
  uint32_t avg_person_bytes = 200;
  uint32_t avg_auction_bytes = 500;
  uint32_t avg_bid_bytes = 100;
  // Events per chunk; each chunk becomes one batch per stream.
  uint32_t chunk_events = 8192;

  // Bounds every field (events <= 2^34, chunk_events in [1, 2^20], ...).
  Status validate() const;
};

// Proportions per 50 events: 1 person, 3 auctions, 46 bids (Beam).
inline constexpr uint64_t kPersonProportion = 1;
inline constexpr uint64_t kAuctionProportion = 3;
inline constexpr uint64_t kBidProportion = 46;
inline constexpr uint64_t kTotalProportion = kPersonProportion + kAuctionProportion + kBidProportion;
inline constexpr int64_t kFirstPersonId = 1000;
inline constexpr int64_t kFirstAuctionId = 1000;
inline constexpr int64_t kFirstCategoryId = 10;
inline constexpr int64_t kNumCategories = 5;

// Column order of the three streams (also the order of the schemas).
enum PersonCol : size_t { kPId, kPName, kPEmail, kPCreditCard, kPCity, kPState, kPDateTime, kPExtra };
enum AuctionCol : size_t {
  kAId,
  kAItemName,
  kADescription,
  kAInitialBid,
  kAReserve,
  kADateTime,
  kAExpires,
  kASeller,
  kACategory,
  kAExtra
};
enum BidCol : size_t { kBAuction, kBBidder, kBPrice, kBChannel, kBUrl, kBDateTime, kBExtra };

// persons(id int64, name string, email_address string, credit_card string,
//   city string, state string, date_time timestamp, extra string)
const SchemaPtr& person_schema();
// auctions(id, item_name, description, initial_bid, reserve, date_time
//   timestamp, expires timestamp, seller, category, extra)
const SchemaPtr& auction_schema();
// bids(auction, bidder, price, channel string, url string, date_time
//   timestamp, extra string)
const SchemaPtr& bid_schema();

// One chunk of consecutive events, split by stream. Each batch's rows are
// in event order; event_time = date_time; seq numbers count per stream
// from 0.
struct Chunk {
  Batch persons;
  Batch auctions;
  Batch bids;
};

class Generator final {
 public:
  // REQUIRES: config.validate().ok()
  explicit Generator(const GeneratorConfig& config);

  bool done() const noexcept { return next_event_ >= config_.events; }
  // The next min(chunk_events, remaining) events.
  Chunk next_chunk();
  EventTime time_of(uint64_t event) const noexcept;

 private:
  void person(uint64_t n, EventTime t);
  void auction(uint64_t n, EventTime t);
  void bid(uint64_t n, EventTime t);

  GeneratorConfig config_;
  uint64_t next_event_ = 0;
  uint64_t seq_[3] = {0, 0, 0};
  engine::BatchBuilder persons_;
  engine::BatchBuilder auctions_;
  engine::BatchBuilder bids_;
};

// Every event of a configuration, generated up front.
struct Events {
  GeneratorConfig config;
  std::vector<Chunk> chunks;
  uint64_t persons = 0;
  uint64_t auctions = 0;
  uint64_t bids = 0;
  uint64_t total() const noexcept { return persons + auctions + bids; }
};

Result<Events> generate(const GeneratorConfig& config);

}  // namespace entente::nexmark
