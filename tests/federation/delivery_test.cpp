// The federation layer's stream delivery without processes or sockets: an
// owner's Exports and an importer's Imports, each over its own in-memory
// Host with a real store in a temporary directory, wired back to back by a
// Wire that queues frames and hands each to the other side. Shows tuples
// flowing with contiguous sequence numbers and no duplicate, a sender
// stopping at the importer's credit and going on when credit comes back, a
// resume after a reconnect that loses frames in flight, and OPENs refused
// with their reasons; and, under a stream contract, its predicate and
// projection applied on the wire and its metering charging what the
// importer acknowledged. MovedTest: a domain of two owner nodes, where the
// one the importer dials answers RESET moved and the importer follows it.
// InternalReadTest: a node reading a stream of another node of its own
// domain, with no export, and a node of another domain refused.
#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/batch.h"
#include "engine/codec.h"
#include "federation/acknowledgements.h"
#include "federation/detail/common.h"
#include "federation/exports.h"
#include "federation/imports.h"
#include "federation/messages.h"
#include "federation/metering.h"
#include "federation/traffic.h"
#include "federation/wire.h"
#include "store/store.h"
#include "tests/contracts/fixture.h"
#include "tests/support/temp_dir.h"

namespace entente::federation {
namespace {

engine::SchemaPtr bids_schema() {
  return engine::make_schema({{"price", engine::Type::Int64}, {"item", engine::Type::String}});
}

// A stream of the test host: an in-memory log of encoded records, taps, and
// appends that become visible when the host commits (as the group commit
// would make them durable, later and on another call).
class MemStream final : public HostStream, public std::enable_shared_from_this<MemStream> {
 public:
  // `host`: where a mirror's appends are queued until it commits.
  MemStream(std::string name, engine::SchemaPtr schema, Host* host = nullptr)
      : name_(std::move(name)), schema_(std::move(schema)), host_(host) {}

  const std::string& name() const override { return name_; }
  engine::SchemaPtr schema() const override { return schema_; }
  uint64_t committed_next() const override {
    std::lock_guard lock(mu_);
    return committed_;
  }
  uint64_t next_seq() const override {
    std::lock_guard lock(mu_);
    return next_;
  }
  uint64_t add_tap(const std::shared_ptr<StreamTap>& tap) override {
    std::lock_guard lock(mu_);
    taps_.push_back(tap);
    return committed_;
  }
  void remove_tap(const StreamTap* tap) override {
    std::lock_guard lock(mu_);
    std::erase_if(taps_, [tap](const std::weak_ptr<StreamTap>& t) { return t.lock().get() == tap; });
  }
  Status read_log(uint64_t from, size_t max_records, size_t max_bytes,
                  std::vector<store::LogRecord>& out) const override {
    std::lock_guard lock(mu_);
    size_t bytes = 0;
    for (const auto& r : log_) {
      if (r.last < from || r.first >= committed_) continue;
      if (out.size() == max_records || (!out.empty() && bytes >= max_bytes)) break;
      out.push_back(store::LogRecord{r.first, r.last, 0, r.encoded});
      bytes += r.encoded.size();
    }
    return {};
  }
  Result<std::optional<uint64_t>> first_retained() const override {
    std::lock_guard lock(mu_);
    if (log_.empty()) return std::optional<uint64_t>();
    return std::optional<uint64_t>(log_.front().first);
  }
  void named_batches(uint64_t first, uint64_t last, std::vector<NamedBatch>& out) const override {
    std::lock_guard lock(mu_);
    for (const auto& n : named_) {
      if (n.last >= first && n.last <= last) out.push_back(n);
    }
  }
  Status append_at(uint64_t first, engine::Batch batch, store::WriteBatch extra,
                   std::vector<NamedBatch> named, std::function<void(const Status&)> done,
                   std::shared_ptr<const std::string> encoded) override;
  void end_feed(const std::string& cause, const std::string& reason) override {
    std::lock_guard lock(mu_);
    feed_ended_ = cause + " | " + reason;
  }

  // The owner's ingest: numbers the rows, makes them durable and visible at
  // once, and hands the record to the taps.
  void publish(engine::Batch b) {
    std::vector<std::shared_ptr<StreamTap>> taps;
    Rec rec;
    {
      std::lock_guard lock(mu_);
      std::vector<engine::Seq> seqs;
      for (size_t i = 0; i < b.rows(); ++i) seqs.push_back(next_ + i);
      b.seq = std::move(seqs);
      rec.first = next_;
      rec.last = next_ + b.rows() - 1;
      engine::encode_batch(b, rec.encoded);
      rec.batch = std::move(b);
      next_ = committed_ = rec.last + 1;
      log_.push_back(rec);
      for (auto& t : taps_) {
        if (auto s = t.lock()) taps.push_back(s);
      }
    }
    for (auto& t : taps) t->on_record({rec.first, rec.last, rec.batch, &rec.encoded});
  }
  // The same for a batch its publisher named (producer, number): the
  // stream remembers it, with `floor` as its producer's floor.
  void publish_named(engine::Batch b, const std::string& producer, uint64_t producer_seq,
                     uint64_t floor = 0) {
    {
      std::lock_guard lock(mu_);
      named_.push_back({producer, producer_seq, next_, next_ + b.rows() - 1, floor});
    }
    publish(std::move(b));
  }
  // The named batches a mirror received, once durable.
  std::vector<NamedBatch> named() const {
    std::lock_guard lock(mu_);
    return named_;
  }
  // Every sequence number stored, in log order.
  std::vector<uint64_t> seqs() const {
    std::lock_guard lock(mu_);
    std::vector<uint64_t> out;
    for (const auto& r : log_) {
      if (r.first >= committed_) break;
      for (uint64_t s : r.batch.seq) out.push_back(s);
    }
    return out;
  }
  size_t record_bytes(size_t i) const {
    std::lock_guard lock(mu_);
    return log_.at(i).encoded.size();
  }
  std::string feed_ended() const {
    std::lock_guard lock(mu_);
    return feed_ended_;
  }
  void committed(uint64_t through) {
    std::lock_guard lock(mu_);
    committed_ = std::max(committed_, through + 1);
  }

 private:
  struct Rec {
    uint64_t first = 0, last = 0;
    std::string encoded;
    engine::Batch batch;
  };
  const std::string name_;
  const engine::SchemaPtr schema_;
  Host* const host_;
  mutable std::mutex mu_;
  uint64_t next_ = 1;       // REQUIRES: mu_
  uint64_t committed_ = 1;  // REQUIRES: mu_
  std::vector<Rec> log_;    // REQUIRES: mu_
  std::vector<std::weak_ptr<StreamTap>> taps_;  // REQUIRES: mu_
  std::string feed_ended_;  // REQUIRES: mu_
  std::vector<NamedBatch> named_;  // REQUIRES: mu_; by ascending last
};

// The test's node: a real store, in-memory streams, and a write queue that
// commit() drains in order, as the group commit does.
class TestHost final : public Host {
 public:
  explicit TestHost(const std::string& dir) {
    store::StoreOptions o;
    o.path = dir + "/db";
    o.write_buffer_bytes = 4u << 20;
    o.block_cache_bytes = 8u << 20;
    auto s = store::Store::open(o);
    if (!s.ok()) throw std::runtime_error(s.error().message);
    store_ = std::move(*s);
  }

  store::Store& store() override { return *store_; }
  base::Registry& metrics() override { return metrics_; }
  void log(const std::string& line) override { lines.push_back(line); }
  HostStreamPtr find_stream(const std::string& name) override {
    auto it = streams.find(name);
    return it == streams.end() ? nullptr : it->second;
  }
  std::vector<HostStreamPtr> mirrors() override {
    std::vector<HostStreamPtr> out;
    for (auto& [n, s] : streams) {
      if (n.find('/') != std::string::npos) out.push_back(s);
    }
    return out;
  }
  Result<HostStreamPtr> create_mirror(const std::string& name, engine::SchemaPtr schema) override {
    auto s = std::make_shared<MemStream>(name, std::move(schema), this);
    streams[name] = s;
    return HostStreamPtr(s);
  }
  std::optional<StreamLocation> locate_stream(std::string_view name) const override {
    auto it = located.find(std::string(name));
    return it == located.end() ? std::nullopt : std::optional<StreamLocation>(it->second);
  }
  Status submit(store::WriteBatch batch, std::function<void(const Status&)> done) override {
    auto writes = std::make_shared<store::WriteBatch>(std::move(batch));
    queue.push_back([this, writes, done = std::move(done)] {
      done(store_->write(*writes, store::Durability::buffered));
    });
    return {};
  }
  // Makes everything queued durable, in order, and runs the callbacks.
  size_t commit() {
    size_t n = 0;
    while (!queue.empty()) {
      auto f = std::move(queue.front());
      queue.pop_front();
      f();
      ++n;
    }
    return n;
  }

  std::map<std::string, std::shared_ptr<MemStream>> streams;
  std::deque<std::function<void()>> queue;
  std::map<std::string, StreamLocation> located;  // streams another node of the domain leads
  std::vector<std::string> lines;

 private:
  std::unique_ptr<store::Store> store_;
  base::Registry metrics_;
};

Status MemStream::append_at(uint64_t first, engine::Batch batch, store::WriteBatch extra,
                            std::vector<NamedBatch> named, std::function<void(const Status&)> done,
                            std::shared_ptr<const std::string> encoded) {
  (void)encoded;
  uint64_t last = 0;
  {
    std::lock_guard lock(mu_);
    if (first != next_ && !log_.empty()) return make_error(Errc::conflict, "append_at " + std::to_string(first));
    std::vector<engine::Seq> seqs;
    for (size_t i = 0; i < batch.rows(); ++i) seqs.push_back(first + i);
    batch.seq = std::move(seqs);
    Rec rec;
    rec.first = first;
    rec.last = last = first + batch.rows() - 1;
    engine::encode_batch(batch, rec.encoded);
    rec.batch = std::move(batch);
    log_.push_back(std::move(rec));
    next_ = last + 1;
  }
  // Durable (and visible) when the host commits.
  return host_->submit(std::move(extra), [self = shared_from_this(), last, named = std::move(named),
                                          done = std::move(done)](const Status& st) {
    self->committed(last);
    {
      std::lock_guard lock(self->mu_);
      for (const auto& n : named) self->named_.push_back(n);
    }
    done(st);
  });
}

// One frame on its way.
struct Frame {
  certs::Identity from;
  certs::Identity to;
  FrameType type;
  uint32_t channel;
  std::string payload;
};

// The link between the two nodes: one queue both sides send into, cut or
// up as the test says.
struct Link {
  std::deque<Frame> frames;
  bool up = true;
  uint32_t next_channel = 1;
};

class TestWire final : public Wire {
 public:
  TestWire(certs::Identity self, certs::Identity other, Link& link)
      : self_(std::move(self)), other_(std::move(other)), link_(link) {}
  Status send(const certs::Identity& peer, FrameType type, uint32_t channel, std::string_view payload) override {
    if (!link_.up || !(peer == other_)) return make_error(Errc::unavailable, "no link to " + peer.uri());
    link_.frames.push_back({self_, peer, type, channel, std::string(payload)});
    return {};
  }
  Result<uint32_t> new_channel(const certs::Identity& peer) override {
    if (!is_up(peer)) return make_error(Errc::unavailable, "no link to " + peer.uri());
    const uint32_t c = link_.next_channel;
    link_.next_channel += 2;
    return c;
  }
  bool is_up(const certs::Identity& peer) const override { return link_.up && peer == other_; }

 private:
  certs::Identity self_;
  certs::Identity other_;
  Link& link_;
};

const certs::Identity kAcme{"acme", "n1"};
const certs::Identity kBeta{"beta", "n1"};

class DeliveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    owner_dir_ = entente::testing::make_temp_dir("fed-owner");
    importer_dir_ = entente::testing::make_temp_dir("fed-importer");
    owner_ = std::make_unique<TestHost>(owner_dir_);
    importer_ = std::make_unique<TestHost>(importer_dir_);
    bids_ = std::make_shared<MemStream>("bids", bids_schema());
    owner_->streams["bids"] = bids_;
    peers_ = std::make_shared<const std::vector<PeerDomainConfig>>(
        std::vector<PeerDomainConfig>{{"acme", "", {{"n1", "127.0.0.1", 1}}}});
    start_owner({{"bids", {"beta"}, {}}});
  }
  void TearDown() override {
    imports_.reset();
    exports_.reset();
    metering_.reset();
    ledger_.reset();
    owner_.reset();
    importer_.reset();
    std::error_code ec;
    std::filesystem::remove_all(owner_dir_, ec);
    std::filesystem::remove_all(importer_dir_, ec);
  }

  // (Re)starts the owner's side with these configured exports.
  void start_owner(std::vector<ExportConfig> exports) {
    exports_.reset();
    owner_acks_ = std::make_unique<Acknowledgements>(owner_->store());
    metering_ = std::make_unique<Metering>(owner_->store(), [this](const std::string& l) { owner_->log(l); });
    ASSERT_TRUE(owner_acks_->load().ok());
    metering_->set_ledger(ledger_.get());
    ASSERT_TRUE(metering_->load().ok());
    exports_ = std::make_unique<Exports>(*owner_, ExportSender::Context{owner_wire_, *metering_, *owner_acks_, owner_traffic_},
                                         Exports::Options{kAcme, std::move(exports), 1u << 20});
    exports_->set_ledger(ledger_.get());
  }
  void start_importer(uint32_t window) {
    imports_ = std::make_unique<Imports>(*importer_, importer_wire_, importer_traffic_,
                                         Imports::Options{kBeta, window, [this] { return peers_; }});
    ASSERT_TRUE(imports_->load().ok());
  }

  // Hands every queued frame to its receiver, as Peering routes them, and
  // lets the importer's writes become durable, until nothing moves. Frames
  // of a type in `hold` are kept back in held_.
  void run(std::vector<FrameType> hold = {}) {
    while (!link_.frames.empty() || !importer_->queue.empty()) {
      while (!link_.frames.empty()) {
        Frame f = std::move(link_.frames.front());
        link_.frames.pop_front();
        if (std::find(hold.begin(), hold.end(), f.type) != hold.end()) {
          held_.push_back(std::move(f));
          continue;
        }
        deliver(f);
      }
      importer_->commit();
    }
  }
  void deliver(const Frame& f) {
    seen_.push_back(f);
    if (f.to == kAcme) {
      if (f.type == FrameType::open) {
        exports_->on_open(f.from, f.channel, f.payload);
      } else {
        (void)exports_->on_frame(f.from, f.type, f.channel, f.payload);
      }
    } else {
      (void)imports_->on_frame(f.from, f.type, f.channel, f.payload);
    }
  }
  void release_held() {
    for (auto& f : held_) link_.frames.push_back(std::move(f));
    held_.clear();
  }
  // Imports acme/bids; the answer.
  Result<ImportInfo> import_bids() {
    std::optional<Result<ImportInfo>> answer;
    imports_->create("acme/bids", nullptr, [&](Result<ImportInfo> r) { answer = std::move(r); },
                     std::chrono::seconds(10));
    run();
    if (!answer) return make_error(Errc::unavailable, "no answer");
    return std::move(*answer);
  }
  // `n` rows priced from `price` on, each item the same width, so every
  // record of n rows encodes to the same size.
  static engine::Batch rows(size_t n, int64_t price) {
    engine::BatchBuilder b(bids_schema());
    for (size_t i = 0; i < n; ++i) {
      b.column(0).ints.push_back(price + static_cast<int64_t>(i));
      b.column(1).append_str("item-0000");
      b.event_time().push_back(1000 + static_cast<int64_t>(i));
      b.seq().push_back(0);
    }
    return b.finish();
  }
  std::shared_ptr<MemStream> mirror() const {
    auto it = importer_->streams.find("acme/bids");
    return it == importer_->streams.end() ? nullptr : it->second;
  }
  std::vector<Frame> seen(FrameType type) const {
    std::vector<Frame> out;
    for (const auto& f : seen_) {
      if (f.type == type) out.push_back(f);
    }
    return out;
  }
  static std::vector<uint64_t> one_to(uint64_t n) {
    std::vector<uint64_t> v(n);
    for (uint64_t i = 0; i < n; ++i) v[i] = i + 1;
    return v;
  }

  std::string owner_dir_, importer_dir_;
  std::unique_ptr<TestHost> owner_, importer_;
  std::shared_ptr<MemStream> bids_;
  std::shared_ptr<const std::vector<PeerDomainConfig>> peers_;
  Link link_;
  TestWire owner_wire_{kAcme, kBeta, link_};
  TestWire importer_wire_{kBeta, kAcme, link_};
  Traffic owner_traffic_, importer_traffic_;
  std::unique_ptr<Acknowledgements> owner_acks_;
  std::unique_ptr<Metering> metering_;
  std::unique_ptr<contracts::Ledger> ledger_;  // the owner's; null: configured exports only
  std::unique_ptr<Exports> exports_;
  std::unique_ptr<Imports> imports_;
  std::vector<Frame> held_;
  std::vector<Frame> seen_;
};

TEST_F(DeliveryTest, TuplesFlowFromTheLogThenLiveWithContiguousNumbersAndNoDuplicate) {
  for (int i = 0; i < 3; ++i) bids_->publish(rows(100, i * 100));  // 1..300, before the import
  start_importer(8u << 20);
  auto info = import_bids();
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(info->state, "active");
  EXPECT_EQ(info->owner, "entente://acme/n1");
  ASSERT_NE(mirror(), nullptr);
  EXPECT_EQ(*mirror()->schema(), *bids_schema());
  EXPECT_EQ(mirror()->seqs(), one_to(300));

  // Live: each record goes as it is committed.
  for (int i = 3; i < 5; ++i) bids_->publish(rows(100, i * 100));
  run();
  EXPECT_EQ(mirror()->seqs(), one_to(500));
  EXPECT_EQ(seen(FrameType::data).size(), 5u);  // one DATA per record
  auto now = imports_->info("acme/bids");
  ASSERT_TRUE(now.has_value());
  EXPECT_EQ(now->tuples, 500u);
  EXPECT_EQ(now->acked, 500u);
  EXPECT_EQ(now->next_seq, 501u);
  // The owner holds the acknowledgement, which pins retention after it.
  EXPECT_EQ(owner_acks_->acked("bids", "beta"), std::optional<uint64_t>(500));
  EXPECT_EQ(exports_->retention_pin("bids"), std::optional<uint64_t>(501));
  EXPECT_EQ(owner_traffic_.tuples("entente://beta/n1").second, 500u);
  EXPECT_EQ(importer_traffic_.tuples("entente://acme/n1").first, 500u);
}

TEST_F(DeliveryTest, AnotherDomainNeverLearnsWhoPublishesAndRefusesNamesSentToIt) {
  // Both sides speak version 3 (the default of the test's wire), and the
  // batches are named: beta still gets plain DATA only.
  bids_->publish_named(rows(10, 0), "loader-7", 1);
  start_importer(8u << 20);
  ASSERT_TRUE(import_bids().ok());
  bids_->publish_named(rows(10, 10), "loader-7", 2);
  run();
  EXPECT_EQ(mirror()->seqs(), one_to(20));
  EXPECT_EQ(seen(FrameType::data).size(), 2u);
  EXPECT_TRUE(seen(FrameType::data_named).empty());
  EXPECT_TRUE(mirror()->named().empty());

  // An owner that sent them anyway breaks the protocol: the importer resets
  // the channel and stores nothing of that DATA.
  bids_->publish(rows(10, 20));
  ASSERT_EQ(link_.frames.size(), 1u);
  Frame& f = link_.frames.front();
  auto d = decode_data(f.payload);
  ASSERT_TRUE(d.ok());
  d->named = {{"loader-7", 3, 21, 30, 0}};
  f.type = FrameType::data_named;
  f.payload = encode(*d);
  run();
  EXPECT_EQ(mirror()->seqs(), one_to(20));
  EXPECT_TRUE(mirror()->named().empty());
  ASSERT_FALSE(seen(FrameType::reset).empty());
  auto reset = decode_reset(seen(FrameType::reset).back().payload);
  ASSERT_TRUE(reset.ok());
  EXPECT_EQ(reset->code, WireError::protocol);
  EXPECT_EQ(reset->reason, "DATA_NAMED on acme/bids, which is not a read of a node of this domain");
}

TEST_F(DeliveryTest, TheSenderStopsAtTheCreditAndGoesOnWhenCreditComesBack) {
  for (int i = 0; i < 5; ++i) bids_->publish(rows(50, i * 50));  // 5 records of 50 tuples
  // Room for two records' DATA and half of a third.
  // (Records differ by a byte or so: the numbers' encodings grow.)
  uint32_t data = 0;
  for (size_t i = 0; i < 5; ++i) data = std::max<uint32_t>(data, static_cast<uint32_t>(bids_->record_bytes(i) + 16));
  ASSERT_GT(bids_->record_bytes(0) + 16, data / 2 + 8);
  start_importer(2 * data + data / 2);
  imports_->create("acme/bids", nullptr, [](Result<ImportInfo>) {}, std::chrono::seconds(10));
  run({FrameType::credit});  // no credit goes back

  ASSERT_NE(mirror(), nullptr);
  EXPECT_EQ(seen(FrameType::data).size(), 2u);
  EXPECT_EQ(mirror()->seqs(), one_to(100));
  EXPECT_EQ(held_.size(), 2u);  // one CREDIT per DATA stored
  // Tuples stored are acknowledged all the same: ACK does not wait for credit.
  EXPECT_EQ(owner_acks_->acked("bids", "beta"), std::optional<uint64_t>(100));

  // More is published meanwhile; nothing goes without credit.
  bids_->publish(rows(50, 250));
  run({FrameType::credit});
  EXPECT_EQ(seen(FrameType::data).size(), 2u);

  // The credit comes back: the rest goes, from the log, in order.
  release_held();
  run();
  EXPECT_EQ(mirror()->seqs(), one_to(300));
  EXPECT_EQ(seen(FrameType::data).size(), 6u);
  EXPECT_EQ(owner_acks_->acked("bids", "beta"), std::optional<uint64_t>(300));
  for (const Frame& f : seen(FrameType::data)) EXPECT_LE(f.payload.size(), 2u * data + data / 2);
}

TEST_F(DeliveryTest, AfterAReconnectTheImportResumesFromWhatItStoredWithNothingLostOrDuplicated) {
  for (int i = 0; i < 4; ++i) bids_->publish(rows(25, i * 25));  // 1..100
  start_importer(8u << 20);
  ASSERT_TRUE(import_bids().ok());
  ASSERT_EQ(mirror()->seqs(), one_to(100));

  // Two more records: the first is stored and its ACK lost, the second is
  // lost on the wire, when the link drops.
  bids_->publish(rows(25, 100));
  bids_->publish(rows(25, 125));
  ASSERT_EQ(link_.frames.size(), 2u);
  deliver(link_.frames.front());  // DATA 101..125
  link_.frames.clear();
  importer_->commit();   // durable; its ACK is queued
  link_.frames.clear();  // ...and lost with the link
  link_.up = false;
  exports_->on_link_down(kBeta);
  imports_->on_link_down(kAcme, "test cut");
  EXPECT_EQ(imports_->info("acme/bids")->state, "connecting");
  EXPECT_EQ(exports_->open_channels(), 0u);
  bids_->publish(rows(25, 150));  // while the link is down: 151..175

  link_.up = true;
  imports_->on_link_up(kAcme);
  run();
  // The second OPEN started where the mirror stood, not from the owner's ack.
  const auto opens = seen(FrameType::open);
  ASSERT_EQ(opens.size(), 2u);
  auto reopen = decode_open(opens[1].payload);
  ASSERT_TRUE(reopen.ok());
  EXPECT_EQ(reopen->from_seq, 126u);
  EXPECT_EQ(mirror()->seqs(), one_to(175));
  EXPECT_EQ(imports_->info("acme/bids")->state, "active");
  EXPECT_EQ(imports_->info("acme/bids")->tuples, 175u);
  EXPECT_EQ(owner_acks_->acked("bids", "beta"), std::optional<uint64_t>(175));
}

TEST_F(DeliveryTest, AnImporterThatRestartsResumesFromItsMirror) {
  for (int i = 0; i < 2; ++i) bids_->publish(rows(40, i * 40));
  start_importer(8u << 20);
  ASSERT_TRUE(import_bids().ok());
  link_.up = false;
  exports_->on_link_down(kBeta);
  imports_.reset();  // the importer stops; its mirror stays in its catalog
  bids_->publish(rows(40, 80));

  link_.up = true;
  start_importer(8u << 20);
  EXPECT_EQ(imports_->info("acme/bids")->next_seq, 81u);
  imports_->on_link_up(kAcme);
  run();
  EXPECT_EQ(decode_open(seen(FrameType::open).back().payload)->from_seq, 81u);
  EXPECT_EQ(mirror()->seqs(), one_to(120));
}

TEST_F(DeliveryTest, AnOpenForAStreamNotExportedToTheDomainIsRefusedWithTheReason) {
  start_owner({{"bids", {"gamma"}, {}}});
  bids_->publish(rows(10, 0));
  start_importer(8u << 20);
  auto answer = import_bids();
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.error().code, Errc::permission_denied);
  EXPECT_EQ(answer.error().message,
            "acme refused acme/bids: stream acme/bids is not exported to domain beta (no stream contract covers it)");
  const auto resets = seen(FrameType::reset);
  ASSERT_EQ(resets.size(), 1u);
  auto reset = decode_reset(resets[0].payload);
  ASSERT_TRUE(reset.ok());
  EXPECT_EQ(reset->code, WireError::not_exported);
  // Nothing was created; the import is forgotten.
  EXPECT_EQ(mirror(), nullptr);
  EXPECT_FALSE(imports_->info("acme/bids").has_value());
  EXPECT_EQ(seen(FrameType::data).size(), 0u);
}

TEST_F(DeliveryTest, AnOpenForAStreamTheOwnerLacksIsRefusedAsNotFound) {
  owner_->streams.clear();  // exported by configuration, but no such stream
  start_importer(8u << 20);
  auto answer = import_bids();
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.error().code, Errc::not_found);
  EXPECT_EQ(answer.error().message, "acme refused acme/bids: no stream acme/bids on entente://acme/n1");
}

TEST_F(DeliveryTest, AnExportWithdrawnLeavesTheImportRefusedAndEndsTheMirrorsFeed) {
  bids_->publish(rows(10, 0));
  start_importer(8u << 20);
  ASSERT_TRUE(import_bids().ok());
  ASSERT_EQ(mirror()->seqs(), one_to(10));

  // The owner restarts without the export; the link comes back.
  link_.up = false;
  exports_->on_link_down(kBeta);
  imports_->on_link_down(kAcme, "owner restarting");
  start_owner({});
  link_.up = true;
  imports_->on_link_up(kAcme);
  run();
  auto info = imports_->info("acme/bids");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->state, "refused");
  EXPECT_EQ(info->reason,
            "acme refused acme/bids: stream acme/bids is not exported to domain beta (no stream contract covers it)");
  EXPECT_EQ(mirror()->feed_ended(),
            "refused by acme: stream acme/bids is not exported to domain beta (no stream contract covers it) | " +
                info->reason);
  // The mirror keeps what it received.
  EXPECT_EQ(mirror()->seqs(), one_to(10));
}

TEST_F(DeliveryTest, UnderAStreamContractOnlyRowsItsPredicatePassesGoAndWhatIsAcknowledgedIsCharged) {
  // acme and beta signed a stream contract for bids, in force now: rows
  // with price > 10, fields item then price, no rate cap; no configured export.
  contracts::Terms t = contracts::testing::stream_terms("acme", "beta", {"bids"});
  t.valid_from_ms = (detail::wall_clock_ms() / 1000 - 60) * 1000;
  t.stream.fields = {"item", "price"};
  t.stream.rate_cap = 0;
  const auto& d = contracts::testing::Domains::get();
  const contracts::Contract c = contracts::testing::active_contract(t, d.acme(), d.beta());
  auto ledger = contracts::Ledger::open(owner_->store());
  ASSERT_TRUE(ledger.ok()) << ledger.error().message;
  ledger_ = std::move(*ledger);
  contracts::testing::record(*ledger_, c);
  start_owner({});

  bids_->publish(rows(100, 0));  // 1..100 priced 0..99: 89 pass
  start_importer(8u << 20);
  auto info = import_bids();
  ASSERT_TRUE(info.ok()) << info.error().message;
  // The importer sees the contract's fields, in its order.
  EXPECT_EQ(*mirror()->schema(),
            *engine::make_schema({{"item", engine::Type::String}, {"price", engine::Type::Int64}}));
  bids_->publish(rows(100, 0));  // 101..200: 89 more pass
  run();
  // The mirror numbers what passed itself and keeps the owner's position.
  EXPECT_EQ(mirror()->seqs(), one_to(178));
  auto kept = importer_->store().get(store::Cf::meta, "import-pos/acme/bids");
  ASSERT_TRUE(kept.ok() && kept->has_value());
  EXPECT_EQ(store::get_key_u64(**kept), 201u);
  EXPECT_EQ(imports_->info("acme/bids")->tuples, 178u);
  // The owner charged the contract for the rows acknowledged, each once.
  EXPECT_EQ(owner_acks_->acked("bids", "beta"), std::optional<uint64_t>(200));
  auto usage = ledger_->usage(c.id);
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->tuples, 178u);
  EXPECT_TRUE(metering_->unbilled("bids", "beta").empty());
}

// ---------------------------------------------------------------------------
// A domain of several nodes: acme is n1 and n2, and n1 leads bids. beta
// lists only acme/n2 in its peers; n2 answers beta's OPEN with RESET moved
// naming n1 and its address, beta dials n1 there and imports from it.

// Frames between any of the nodes, and which links are up. A dial target
// links only when the node at that address is the one named (as the TLS
// identity check decides between real nodes).
struct Net {
  std::deque<Frame> frames;
  std::set<std::pair<std::string, std::string>> up;  // URI pairs, both ways
  std::map<std::string, certs::Identity> at;         // "host:port" -> the node listening there
  std::map<std::string, uint16_t> versions;          // URI -> protocol version it speaks
  std::vector<std::pair<std::string, std::string>> dialed;  // (URI, host:port) asked
  std::deque<std::pair<certs::Identity, certs::Identity>> link_ups;  // (node, peer) to tell
  uint32_t next_channel = 1;

  void link(const certs::Identity& a, const certs::Identity& b) {
    up.insert({a.uri(), b.uri()});
    up.insert({b.uri(), a.uri()});
  }
  bool is_up(const certs::Identity& a, const certs::Identity& b) const { return up.count({a.uri(), b.uri()}) > 0; }
  uint16_t version(const certs::Identity& id) const {
    auto it = versions.find(id.uri());
    return it == versions.end() ? kProtocolVersion : it->second;
  }
};

class NetWire final : public Wire {
 public:
  NetWire(certs::Identity self, Net& net) : self_(std::move(self)), net_(net) {}
  Status send(const certs::Identity& peer, FrameType type, uint32_t channel, std::string_view payload) override {
    if (!is_up(peer)) return make_error(Errc::unavailable, "no link to " + peer.uri());
    net_.frames.push_back({self_, peer, type, channel, std::string(payload)});
    return {};
  }
  Result<uint32_t> new_channel(const certs::Identity& peer) override {
    if (!is_up(peer)) return make_error(Errc::unavailable, "no link to " + peer.uri());
    const uint32_t c = net_.next_channel;
    net_.next_channel += 2;
    return c;
  }
  bool is_up(const certs::Identity& peer) const override { return net_.is_up(self_, peer); }
  uint16_t version(const certs::Identity& peer) const override {
    return std::min(net_.version(self_), net_.version(peer));
  }
  Status add_dial_target(const certs::Identity& peer, const std::string& host, uint16_t port) override {
    const std::string address = host + ":" + std::to_string(port);
    net_.dialed.emplace_back(peer.uri(), address);
    auto it = net_.at.find(address);
    if (it != net_.at.end() && it->second == peer && !is_up(peer)) {
      net_.link(self_, peer);
      net_.link_ups.emplace_back(self_, peer);
    }
    return {};
  }

 private:
  certs::Identity self_;
  Net& net_;
};

const certs::Identity kAcme2{"acme", "n2"};

class MovedTest : public ::testing::Test {
 protected:
  // One node of the owner's domain: its host, exports and wire.
  struct Owner {
    Owner(const certs::Identity& id, Net& net, const std::string& dir)
        : host(dir), wire(id, net), acks(host.store()), metering(host.store(), [this](const std::string& l) {
            host.log(l);
          }) {
      EXPECT_TRUE(acks.load().ok());
      EXPECT_TRUE(metering.load().ok());
      exports = std::make_unique<Exports>(host, ExportSender::Context{wire, metering, acks, traffic},
                                          Exports::Options{id, {{"bids", {"beta"}, {}}}, 1u << 20});
    }
    TestHost host;
    NetWire wire;
    Traffic traffic;
    Acknowledgements acks;
    Metering metering;
    std::unique_ptr<Exports> exports;
  };

  void SetUp() override {
    for (const char* d : {"moved-n1", "moved-n2", "moved-beta"}) dirs_.push_back(entente::testing::make_temp_dir(d));
    n1_ = std::make_unique<Owner>(kAcme, net_, dirs_[0]);
    n2_ = std::make_unique<Owner>(kAcme2, net_, dirs_[1]);
    importer_ = std::make_unique<TestHost>(dirs_[2]);
    bids_ = std::make_shared<MemStream>("bids", bids_schema());
    n1_->host.streams["bids"] = bids_;
    // n2 knows from the domain's catalog that n1 leads bids.
    n2_->host.located["bids"] = StreamLocation{"n1", "127.0.0.1:7001"};
    net_.at["127.0.0.1:7001"] = kAcme;
    net_.at["127.0.0.1:7002"] = kAcme2;
    net_.link(kBeta, kAcme2);  // beta dials the one node it lists
    set_peers({"n2"});
  }
  void TearDown() override {
    imports_.reset();
    n1_.reset();
    n2_.reset();
    importer_.reset();
    std::error_code ec;
    for (const auto& d : dirs_) std::filesystem::remove_all(d, ec);
  }
  void set_peers(const std::vector<std::string>& nodes) {
    PeerDomainConfig acme{"acme", "", {}};
    for (const auto& n : nodes) acme.nodes.push_back({n, "127.0.0.1", static_cast<uint16_t>(n == "n1" ? 7001 : 7002)});
    peers_ = std::make_shared<const std::vector<PeerDomainConfig>>(std::vector<PeerDomainConfig>{acme});
  }
  void start_importer() {
    imports_ = std::make_unique<Imports>(*importer_, importer_wire_, importer_traffic_,
                                         Imports::Options{kBeta, 8u << 20, [this] { return peers_; }});
    ASSERT_TRUE(imports_->load().ok());
  }
  // Delivers frames, link-ups, durable writes and the importer's timer
  // until nothing moves.
  void run() {
    for (int round = 0; round < 100; ++round) {
      bool moved = false;
      while (!net_.frames.empty()) {
        Frame f = std::move(net_.frames.front());
        net_.frames.pop_front();
        if (tamper_) tamper_(f);
        seen_.push_back(f);
        moved = true;
        Owner* o = f.to == kAcme ? n1_.get() : f.to == kAcme2 ? n2_.get() : nullptr;
        if (o == nullptr) {
          (void)imports_->on_frame(f.from, f.type, f.channel, f.payload);
        } else if (f.type == FrameType::open) {
          o->exports->on_open(f.from, f.channel, f.payload);
        } else {
          (void)o->exports->on_frame(f.from, f.type, f.channel, f.payload);
        }
      }
      while (!net_.link_ups.empty()) {
        auto [self, peer] = net_.link_ups.front();
        net_.link_ups.pop_front();
        if (self == kBeta) imports_->on_link_up(peer);
        moved = true;
      }
      if (importer_->commit() > 0) moved = true;
      imports_->tick();
      if (!moved && net_.frames.empty()) return;
    }
    FAIL() << "frames still moving after 100 rounds";
  }
  Result<ImportInfo> import_bids() {
    std::optional<Result<ImportInfo>> answer;
    imports_->create("acme/bids", nullptr, [&](Result<ImportInfo> r) { answer = std::move(r); },
                     std::chrono::seconds(10));
    run();
    if (!answer) return make_error(Errc::unavailable, "no answer");
    return std::move(*answer);
  }
  std::vector<Frame> seen(FrameType type, const certs::Identity& from) const {
    std::vector<Frame> out;
    for (const auto& f : seen_) {
      if (f.type == type && f.from == from) out.push_back(f);
    }
    return out;
  }
  std::shared_ptr<MemStream> mirror() const {
    auto it = importer_->streams.find("acme/bids");
    return it == importer_->streams.end() ? nullptr : it->second;
  }
  static engine::Batch rows(size_t n, int64_t price) {
    engine::BatchBuilder b(bids_schema());
    for (size_t i = 0; i < n; ++i) {
      b.column(0).ints.push_back(price + static_cast<int64_t>(i));
      b.column(1).append_str("item-0000");
      b.event_time().push_back(1000 + static_cast<int64_t>(i));
      b.seq().push_back(0);
    }
    return b.finish();
  }
  static std::vector<uint64_t> one_to(uint64_t n) {
    std::vector<uint64_t> v(n);
    for (uint64_t i = 0; i < n; ++i) v[i] = i + 1;
    return v;
  }

  std::vector<std::string> dirs_;
  Net net_;
  std::unique_ptr<Owner> n1_, n2_;
  std::unique_ptr<TestHost> importer_;
  std::shared_ptr<MemStream> bids_;
  std::shared_ptr<const std::vector<PeerDomainConfig>> peers_;
  NetWire importer_wire_{kBeta, net_};
  Traffic importer_traffic_;
  std::unique_ptr<Imports> imports_;
  std::function<void(Frame&)> tamper_;
  std::vector<Frame> seen_;
};

TEST_F(MovedTest, ANodeThatDoesNotLeadTheStreamAnswersMovedAndTheImporterGetsEveryTupleOnceFromTheLeader) {
  for (int i = 0; i < 3; ++i) bids_->publish(rows(100, i * 100));  // 1..300
  start_importer();
  auto info = import_bids();
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(info->state, "active");
  EXPECT_EQ(info->owner, "entente://acme/n1");

  // n2 answered the OPEN with where the stream is, and nothing else.
  const auto from_n2 = seen(FrameType::reset, kAcme2);
  ASSERT_EQ(from_n2.size(), 1u);
  auto reset = decode_reset(from_n2[0].payload);
  ASSERT_TRUE(reset.ok()) << reset.error().message;
  EXPECT_EQ(reset->code, WireError::moved);
  EXPECT_EQ(reset->reason, "n1@127.0.0.1:7001");
  EXPECT_TRUE(seen(FrameType::open_ok, kAcme2).empty());
  // beta dialed n1 there, although its configuration lists only n2.
  ASSERT_EQ(net_.dialed.size(), 1u);
  EXPECT_EQ(net_.dialed[0], std::make_pair(std::string("entente://acme/n1"), std::string("127.0.0.1:7001")));
  EXPECT_EQ(seen(FrameType::open, kBeta).size(), 2u);
  EXPECT_EQ(mirror()->seqs(), one_to(300));

  // Live tuples follow, every one once.
  bids_->publish(rows(100, 300));
  bids_->publish(rows(50, 400));
  run();
  EXPECT_EQ(mirror()->seqs(), one_to(450));
  EXPECT_EQ(imports_->info("acme/bids")->tuples, 450u);
  EXPECT_EQ(n1_->acks.acked("bids", "beta"), std::optional<uint64_t>(450));
  EXPECT_EQ(importer_traffic_.tuples("entente://acme/n1").first, 450u);

  // After a link drop the import goes straight back to the leader.
  net_.up.erase({kBeta.uri(), kAcme.uri()});
  net_.up.erase({kAcme.uri(), kBeta.uri()});
  n1_->exports->on_link_down(kBeta);
  imports_->on_link_down(kAcme, "test cut");
  bids_->publish(rows(25, 450));
  net_.link(kBeta, kAcme);
  imports_->on_link_up(kAcme);
  run();
  EXPECT_EQ(seen(FrameType::open, kBeta).back().to, kAcme);
  EXPECT_EQ(mirror()->seqs(), one_to(475));
  EXPECT_EQ(imports_->info("acme/bids")->state, "active");
}

TEST_F(MovedTest, MovesAreBoundedAndALoopIsRefusedWithTheRoute) {
  // The nodes' catalogs disagree: each says the other leads bids.
  n1_->host.streams.clear();
  n1_->host.located["bids"] = StreamLocation{"n2", "127.0.0.1:7002"};
  start_importer();
  auto info = import_bids();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.error().code, Errc::unavailable);
  EXPECT_EQ(info.error().message,
            "acme refused acme/bids: moved 4 times without reaching the node that leads it "
            "(route n2 -> n1 -> n2 -> n1 -> n2); trying the configured nodes again in 10 s");
  // Four OPENs, each answered moved; then no more.
  EXPECT_EQ(seen(FrameType::open, kBeta).size(), 4u);
  EXPECT_EQ(seen(FrameType::reset, kAcme).size() + seen(FrameType::reset, kAcme2).size(), 4u);
  EXPECT_EQ(mirror(), nullptr);
  EXPECT_FALSE(imports_->info("acme/bids").has_value());
}

TEST_F(MovedTest, ANodeNamingItselfIsRefusedAtOnce) {
  start_importer();
  // Exports never names this node itself: only a broken or hostile owner
  // would, so the frame is forged here.
  tamper_ = [](Frame& f) {
    if (f.type == FrameType::reset) f.payload = encode(Reset{WireError::moved, "n2@127.0.0.1:7002"});
  };
  auto info = import_bids();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.error().message,
            "acme refused acme/bids: entente://acme/n2 named itself (route n2 -> n2); trying the configured "
            "nodes again in 10 s");
  EXPECT_TRUE(net_.dialed.empty());
}

TEST_F(MovedTest, AMalformedMovedIsAProtocolErrorAndTheImportTriesAgain) {
  for (int i = 0; i < 2; ++i) bids_->publish(rows(10, i * 10));
  start_importer();
  int forged = 0;
  tamper_ = [&forged](Frame& f) {
    if (f.type == FrameType::reset && forged == 0) {
      ++forged;
      // Raw bytes: code 11 with a reason that is no address.
      f.payload = std::string("\x00\x0b\x00\x0b", 4) + "n1@nowhere!";
    }
  };
  imports_->create("acme/bids", nullptr, [](Result<ImportInfo>) {}, std::chrono::seconds(10));
  run();
  EXPECT_EQ(forged, 1);
  // Nothing dialed, the channel is gone, the import waits to try again.
  EXPECT_TRUE(net_.dialed.empty());
  ASSERT_FALSE(imports_->info("acme/bids").has_value());  // no mirror yet
  const auto resets = seen(FrameType::reset, kAcme2);
  ASSERT_EQ(resets.size(), 1u);
  EXPECT_FALSE(decode_reset(resets[0].payload).ok());

  // The retry a second later reaches n2 again, which answers well this
  // time: the import follows it to n1.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  run();
  ASSERT_NE(mirror(), nullptr);
  EXPECT_EQ(mirror()->seqs(), one_to(20));
  EXPECT_EQ(imports_->info("acme/bids")->owner, "entente://acme/n1");
}

TEST_F(MovedTest, AVersionOneImporterGetsNotFoundNamingTheLeaderAndTriesItsNextNode) {
  bids_->publish(rows(10, 0));
  net_.versions[kBeta.uri()] = 1;  // beta speaks version 1 only
  start_importer();
  auto refused = import_bids();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, Errc::not_found);
  EXPECT_EQ(refused.error().message,
            "acme refused acme/bids: no stream acme/bids on entente://acme/n2: it is led by node n1, whose peer "
            "link is at 127.0.0.1:7001 (list that node in federation.peers, or upgrade the importing node to "
            "protocol version 2)");
  EXPECT_TRUE(net_.dialed.empty());

  // Its admin lists n1 too: not_found moves it on to n1, as before moves.
  set_peers({"n2", "n1"});
  net_.link(kBeta, kAcme);
  auto info = import_bids();
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(info->owner, "entente://acme/n1");
  EXPECT_EQ(mirror()->seqs(), one_to(10));
}

// ---------------------------------------------------------------------------
// Reads between two nodes of one domain (docs/federation.md, "Reading a
// stream of another node of the domain"): node acme/n2 reads acme/n1's
// stream `bids` into "@n1/bids" while n1 exports nothing; a node of
// another domain asking the same is refused.

class InternalReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    owner_dir_ = entente::testing::make_temp_dir("fed-internal-n1");
    reader_dir_ = entente::testing::make_temp_dir("fed-internal-n2");
    owner_ = std::make_unique<TestHost>(owner_dir_);
    reader_ = std::make_unique<TestHost>(reader_dir_);
    bids_ = std::make_shared<MemStream>("bids", bids_schema());
    owner_->streams["bids"] = bids_;
    // n2 lists n1 among the nodes of its own domain.
    peers_ = std::make_shared<const std::vector<PeerDomainConfig>>(
        std::vector<PeerDomainConfig>{{"acme", "", {{"n1", "127.0.0.1", 1}}}});
    net_.link(kAcme, kAcme2);
    start_owner();
    start_reader();
  }
  void TearDown() override {
    imports_.reset();
    exports_.reset();
    metering_.reset();
    owner_acks_.reset();
    owner_.reset();
    reader_.reset();
    std::error_code ec;
    std::filesystem::remove_all(owner_dir_, ec);
    std::filesystem::remove_all(reader_dir_, ec);
  }

  // (Re)starts n1's owner side, exporting nothing, from what its store holds.
  void start_owner() {
    exports_.reset();
    owner_acks_ = std::make_unique<Acknowledgements>(owner_->store());
    ASSERT_TRUE(owner_acks_->load().ok());
    metering_ = std::make_unique<Metering>(owner_->store(), [this](const std::string& l) { owner_->log(l); });
    ASSERT_TRUE(metering_->load().ok());
    exports_ = std::make_unique<Exports>(
        *owner_, ExportSender::Context{owner_wire_, *metering_, *owner_acks_, owner_traffic_},
        Exports::Options{kAcme, {}, 1u << 20});
  }
  // (Re)starts n2's importer side from its catalog (its mirrors).
  void start_reader(uint32_t window = 8u << 20) {
    imports_.reset();
    imports_ = std::make_unique<Imports>(*reader_, reader_wire_, reader_traffic_,
                                         Imports::Options{kAcme2, window, [this] { return peers_; }});
    ASSERT_TRUE(imports_->load().ok());
  }
  void run(std::vector<FrameType> hold = {}) {
    while (!net_.frames.empty() || !reader_->queue.empty()) {
      while (!net_.frames.empty()) {
        Frame f = std::move(net_.frames.front());
        net_.frames.pop_front();
        if (std::find(hold.begin(), hold.end(), f.type) != hold.end()) {
          held_.push_back(std::move(f));
          continue;
        }
        deliver(f);
      }
      reader_->commit();
    }
  }
  void deliver(const Frame& f) {
    seen_.push_back(f);
    if (f.to == kAcme) {
      if (f.type == FrameType::open) {
        exports_->on_open(f.from, f.channel, f.payload);
      } else {
        (void)exports_->on_frame(f.from, f.type, f.channel, f.payload);
      }
    } else if (f.to == kAcme2) {
      (void)imports_->on_frame(f.from, f.type, f.channel, f.payload);
    }
  }
  Result<ImportInfo> read_bids(std::vector<FrameType> hold = {}) {
    std::optional<Result<ImportInfo>> answer;
    imports_->create_internal("bids", "n1", nullptr, [&](Result<ImportInfo> r) { answer = std::move(r); },
                              std::chrono::seconds(10));
    run(std::move(hold));
    if (!answer) return make_error(Errc::unavailable, "no answer");
    return std::move(*answer);
  }
  // The link between n1 and n2 drops; both sides learn it.
  void cut() {
    net_.up.clear();
    if (exports_) exports_->on_link_down(kAcme2);
    if (imports_) imports_->on_link_down(kAcme, "test cut");
  }
  void reconnect() {
    net_.link(kAcme, kAcme2);
    imports_->on_link_up(kAcme);
    run();
  }
  std::shared_ptr<MemStream> mirror() const {
    auto it = reader_->streams.find("@n1/bids");
    return it == reader_->streams.end() ? nullptr : it->second;
  }
  std::vector<Frame> seen(FrameType type) const {
    std::vector<Frame> out;
    for (const auto& f : seen_) {
      if (f.type == type) out.push_back(f);
    }
    return out;
  }
  static engine::Batch rows(size_t n, int64_t price) {
    engine::BatchBuilder b(bids_schema());
    for (size_t i = 0; i < n; ++i) {
      b.column(0).ints.push_back(price + static_cast<int64_t>(i));
      b.column(1).append_str("item-0000");
      b.event_time().push_back(1000 + static_cast<int64_t>(i));
      b.seq().push_back(0);
    }
    return b.finish();
  }
  static std::vector<uint64_t> range(uint64_t from, uint64_t to) {
    std::vector<uint64_t> v;
    for (uint64_t i = from; i <= to; ++i) v.push_back(i);
    return v;
  }

  std::string owner_dir_, reader_dir_;
  std::unique_ptr<TestHost> owner_, reader_;
  std::shared_ptr<MemStream> bids_;
  std::shared_ptr<const std::vector<PeerDomainConfig>> peers_;
  Net net_;
  NetWire owner_wire_{kAcme, net_};
  NetWire reader_wire_{kAcme2, net_};
  Traffic owner_traffic_, reader_traffic_;
  std::unique_ptr<Acknowledgements> owner_acks_;
  std::unique_ptr<Metering> metering_;
  std::unique_ptr<Exports> exports_;
  std::unique_ptr<Imports> imports_;
  std::vector<Frame> held_;
  std::vector<Frame> seen_;
};

TEST_F(InternalReadTest, ANodeOfTheDomainGetsEveryTupleOnceWithTheOwnersNumbersWithoutAnExport) {
  for (int i = 0; i < 3; ++i) bids_->publish(rows(100, i * 100));  // 1..300, before the read
  auto info = read_bids();
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(info->stream, "@n1/bids");
  EXPECT_EQ(info->node, "n1");
  EXPECT_EQ(info->owner, "entente://acme/n1");
  EXPECT_EQ(info->state, "active");
  // The OPEN names the stream as its owner's domain does.
  ASSERT_EQ(seen(FrameType::open).size(), 1u);
  EXPECT_EQ(decode_open(seen(FrameType::open)[0].payload)->stream, "acme/bids");
  ASSERT_NE(mirror(), nullptr);
  EXPECT_EQ(*mirror()->schema(), *bids_schema());  // every field
  EXPECT_EQ(mirror()->seqs(), range(1, 300));

  for (int i = 3; i < 5; ++i) bids_->publish(rows(100, i * 100));
  run();
  EXPECT_EQ(mirror()->seqs(), range(1, 500));
  EXPECT_EQ(bids_->seqs(), mirror()->seqs());  // the owner's numbers, one for one
  EXPECT_EQ(imports_->info("@n1/bids")->acked, 500u);
  // The owner keeps n2's acknowledgement apart from any domain's, and it
  // pins the stream after it.
  EXPECT_EQ(owner_acks_->acked("bids", "@n2"), std::optional<uint64_t>(500));
  EXPECT_EQ(owner_acks_->acked("bids", "acme"), std::nullopt);
  EXPECT_EQ(exports_->retention_pin("bids"), std::optional<uint64_t>(501));
  EXPECT_NE(std::find(owner_->lines.begin(), owner_->lines.end(),
                      "federation: entente://acme/n2 opened acme/bids from 1 (a node of this domain)"),
            owner_->lines.end());
}

// A follower's copy (docs/cluster.md, "Replicated stream logs") learns
// which batches publishers named, so that it answers their retries as the
// leader would once it leads the stream.
TEST_F(InternalReadTest, ANodeOfTheDomainGetsThePublishersNamesWithTheTuplesOverVersionThree) {
  // From the log: two named batches, one unnamed between them.
  bids_->publish_named(rows(10, 0), "loader-7", 41);       // 1..10
  bids_->publish(rows(5, 10));                             // 11..15
  bids_->publish_named(rows(10, 15), "loader-7", 42, 40);  // 16..25
  ASSERT_TRUE(read_bids().ok());
  // Live.
  bids_->publish_named(rows(10, 25), "pub.b:2", 1);  // 26..35
  run();
  EXPECT_EQ(mirror()->seqs(), range(1, 35));
  const std::vector<NamedBatch> want = {
      {"loader-7", 41, 1, 10, 0}, {"loader-7", 42, 16, 25, 40}, {"pub.b:2", 1, 26, 35, 0}};
  EXPECT_EQ(mirror()->named(), want);
  // Each DATA carries the names of the batches it completes, and only
  // those: the unnamed record goes as plain DATA.
  EXPECT_EQ(seen(FrameType::data_named).size(), 3u);
  EXPECT_EQ(seen(FrameType::data).size(), 1u);
  for (const auto& f : seen(FrameType::data_named)) {
    auto d = decode_data_named(f.payload);
    ASSERT_TRUE(d.ok()) << d.error().message;
    ASSERT_EQ(d->named.size(), 1u);
    EXPECT_EQ(d->named[0].first, d->first_seq);
    EXPECT_EQ(d->named[0].last, d->first_seq + d->count - 1);
  }
}

TEST_F(InternalReadTest, AReaderOfVersionTwoGetsPlainDataAndEveryTuple) {
  net_.versions[kAcme2.uri()] = 2;  // n2 was built before version 3
  bids_->publish_named(rows(10, 0), "loader-7", 1);
  ASSERT_TRUE(read_bids().ok());
  bids_->publish_named(rows(10, 10), "loader-7", 2);
  run();
  EXPECT_EQ(mirror()->seqs(), range(1, 20));
  EXPECT_EQ(seen(FrameType::data).size(), 2u);
  EXPECT_TRUE(seen(FrameType::data_named).empty());
  EXPECT_TRUE(mirror()->named().empty());
}

TEST_F(InternalReadTest, AReaderThatRestartsResumesFromItsMirror) {
  for (int i = 0; i < 2; ++i) bids_->publish(rows(40, i * 40));
  ASSERT_TRUE(read_bids().ok());
  cut();
  imports_.reset();  // n2 stops; its mirror stays in its catalog
  bids_->publish(rows(40, 80));

  start_reader();
  auto info = imports_->info("@n1/bids");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->node, "n1");
  EXPECT_EQ(info->next_seq, 81u);
  reconnect();
  EXPECT_EQ(decode_open(seen(FrameType::open).back().payload)->from_seq, 81u);
  EXPECT_EQ(decode_open(seen(FrameType::open).back().payload)->stream, "acme/bids");
  EXPECT_EQ(mirror()->seqs(), range(1, 120));
  EXPECT_EQ(imports_->info("@n1/bids")->state, "active");
}

TEST_F(InternalReadTest, AfterTheOwnerRestartsTheReaderResumesWithNothingLostOrDuplicated) {
  for (int i = 0; i < 4; ++i) bids_->publish(rows(25, i * 25));  // 1..100
  ASSERT_TRUE(read_bids().ok());
  ASSERT_EQ(mirror()->seqs(), range(1, 100));
  // 101..125 is stored and its ACK lost, 126..150 lost on the wire, when
  // n1 dies.
  bids_->publish(rows(25, 100));
  bids_->publish(rows(25, 125));
  ASSERT_EQ(net_.frames.size(), 2u);
  deliver(net_.frames.front());
  net_.frames.clear();
  reader_->commit();
  net_.frames.clear();
  cut();
  start_owner();  // n1 restarts: what n2 acknowledged comes back from its store
  EXPECT_EQ(owner_acks_->acked("bids", "@n2"), std::optional<uint64_t>(100));
  EXPECT_EQ(exports_->retention_pin("bids"), std::optional<uint64_t>(101));
  bids_->publish(rows(25, 150));  // 151..175 while the link is down

  reconnect();
  EXPECT_EQ(decode_open(seen(FrameType::open).back().payload)->from_seq, 126u);
  EXPECT_EQ(mirror()->seqs(), range(1, 175));
  EXPECT_EQ(owner_acks_->acked("bids", "@n2"), std::optional<uint64_t>(175));
}

TEST_F(InternalReadTest, TheOwnerKeepsWhatTheReaderHasNotAcknowledgedUntilItIsReleased) {
  bids_->publish(rows(100, 0));  // 1..100
  // Every ACK is held back: n2 stored the tuples, n1 does not know it.
  ASSERT_TRUE(read_bids({FrameType::ack}).ok());
  ASSERT_EQ(mirror()->seqs(), range(1, 100));
  EXPECT_EQ(owner_acks_->acked("bids", "@n2"), std::nullopt);
  EXPECT_EQ(exports_->retention_pin("bids"), std::optional<uint64_t>(1));
  for (auto& f : held_) net_.frames.push_back(std::move(f));
  held_.clear();
  run();
  EXPECT_EQ(exports_->retention_pin("bids"), std::optional<uint64_t>(101));

  // The link drops and the owner restarts: the pin stays where n2 stood,
  // whatever is appended meanwhile.
  cut();
  start_owner();
  bids_->publish(rows(50, 100));
  EXPECT_EQ(exports_->retention_pin("bids"), std::optional<uint64_t>(101));

  // The reading fragment is gone: its pin goes, durably.
  ASSERT_TRUE(exports_->release_internal_reader("bids", "n2").ok());
  EXPECT_EQ(exports_->retention_pin("bids"), std::nullopt);
  start_owner();
  EXPECT_EQ(exports_->retention_pin("bids"), std::nullopt);
}

TEST_F(InternalReadTest, AReadThatIsDeletedUnsubscribesAndReleasesTheOwnersPin) {
  bids_->publish(rows(100, 0));
  ASSERT_TRUE(read_bids().ok());
  ASSERT_EQ(exports_->retention_pin("bids"), std::optional<uint64_t>(101));
  ASSERT_TRUE(imports_->forget("@n1/bids").ok());
  run();
  const auto resets = seen(FrameType::reset);
  ASSERT_EQ(resets.size(), 1u);
  EXPECT_EQ(decode_reset(resets[0].payload)->code, WireError::none);
  EXPECT_EQ(exports_->open_channels(), 0u);
  EXPECT_EQ(owner_acks_->acked("bids", "@n2"), std::nullopt);
  EXPECT_EQ(exports_->retention_pin("bids"), std::nullopt);
  start_owner();  // durably
  EXPECT_EQ(exports_->retention_pin("bids"), std::nullopt);
}

// A failover has just named n1 the leader of bids, and n1 is still making
// its copy the stream (docs/cluster.md, "Failover of a stream's leader"):
// a read redirected to n1 at that moment is told to ask again, not that
// there is no such stream (a final refusal that would leave the reading
// fragment stalled for good), and it gets every tuple once n1 serves it.
TEST_F(InternalReadTest, AReadOfAStreamAFailoverJustMovedHereIsAskedAgainNotRefused) {
  bids_->publish(rows(10, 0));
  owner_->streams.erase("bids");
  owner_->located["bids"] = StreamLocation{"n1", ""};
  std::optional<Result<ImportInfo>> answer;
  imports_->create_internal("bids", "n1", nullptr, [&](Result<ImportInfo> r) { answer = std::move(r); },
                            std::chrono::seconds(10));
  run();
  ASSERT_EQ(seen(FrameType::reset).size(), 1u);
  auto reset = decode_reset(seen(FrameType::reset)[0].payload);
  ASSERT_TRUE(reset.ok());
  EXPECT_EQ(reset->code, WireError::internal);
  EXPECT_EQ(reset->reason,
            "acme/bids is led by entente://acme/n1 from now on, which is not ready to serve it yet (a failover just "
            "moved it here): open it again in a moment");
  EXPECT_FALSE(answer.has_value()) << "the read was answered: " << (answer->ok() ? "ok" : answer->error().message);
  EXPECT_EQ(mirror(), nullptr);  // waiting to ask again

  // n1 serves bids now; the read asks again a second later.
  owner_->streams["bids"] = bids_;
  owner_->located.erase("bids");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  imports_->tick();
  run();
  ASSERT_TRUE(answer.has_value());
  ASSERT_TRUE(answer->ok()) << answer->error().message;
  ASSERT_NE(mirror(), nullptr);
  EXPECT_EQ(mirror()->seqs(), range(1, 10));
}

TEST_F(InternalReadTest, ANodeOfAnotherDomainIsRefusedWithTheReason) {
  // beta/n1 asks n1 for acme/bids as n2 does: n1 exports nothing to beta.
  bids_->publish(rows(10, 0));
  net_.link(kAcme, kBeta);
  exports_->on_open(kBeta, 7, encode(Open{"acme/bids", 0, 1u << 20}));
  ASSERT_EQ(net_.frames.size(), 1u);
  const Frame f = net_.frames.front();
  EXPECT_EQ(f.to, kBeta);
  ASSERT_EQ(f.type, FrameType::reset);
  auto reset = decode_reset(f.payload);
  ASSERT_TRUE(reset.ok());
  EXPECT_EQ(reset->code, WireError::not_exported);
  EXPECT_EQ(reset->reason, "stream acme/bids is not exported to domain beta (no stream contract covers it)");
  EXPECT_EQ(exports_->open_channels(), 0u);
  EXPECT_EQ(owner_acks_->of("bids").size(), 0u);
}

TEST_F(InternalReadTest, AReadNamingThisNodeOrABadNameIsRefusedBeforeAnythingIsSent) {
  std::vector<Result<ImportInfo>> answers;
  auto keep = [&](Result<ImportInfo> r) { answers.push_back(std::move(r)); };
  imports_->create_internal("bids", "n2", nullptr, keep, std::chrono::seconds(1));
  imports_->create_internal("bids", "N 1", nullptr, keep, std::chrono::seconds(1));
  imports_->create_internal("beta/bids", "n1", nullptr, keep, std::chrono::seconds(1));
  imports_->create("@n1/bids", nullptr, keep, std::chrono::seconds(1));
  ASSERT_EQ(answers.size(), 4u);
  for (const auto& a : answers) {
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.error().code, Errc::invalid_argument);
  }
  EXPECT_EQ(answers[0].error().message, "stream bids of node n2 is this node's own; read it as 'bids'");
  EXPECT_EQ(answers[1].error().message, "node name 'N 1' is not [a-z][a-z0-9-]* of at most 63 characters");
  EXPECT_EQ(answers[2].error().message,
            "'beta/bids' is not the name of a stream of domain acme (NAME, without a domain)");
  EXPECT_EQ(answers[3].error().message,
            "'@n1/bids' names a read of a node of this domain; ask for NAME and the node");
  EXPECT_TRUE(net_.frames.empty());
  EXPECT_TRUE(imports_->list().empty());
}

}  // namespace
}  // namespace entente::federation
