// A fragment taken over by another node (NodeImpl::deploy_query with
// FragmentOf::takeover; docs/cluster.md, "A fragment's state stream"), with
// two real nodes' stores in one process: n1 runs the fragment, checkpoints,
// goes on, and "dies"; n2 holds what followers would hold (the input, the
// whole state stream, the outputs only up to the checkpoint) and takes the
// fragment over: it reuses those streams, recovers from the state stream
// and reproduces the outputs n1 wrote after the checkpoint, under the same
// sequence numbers and equal row for row. Taking over without the streams
// is refused, naming the missing one.
#include "broker/detail/node_impl.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/batch.h"
#include "engine/codec.h"
#include "store/stream_log.h"
#include "tests/support/temp_dir.h"

namespace entente::broker::detail {
namespace {

using namespace std::chrono_literals;

const engine::SchemaPtr kInSchema =
    engine::make_schema({{"k", engine::Type::Int64}, {"ts", engine::Type::Timestamp}});
constexpr int64_t kHourMs = 3'600'000;

const char* kNetwork = R"({"name":"q--f","inputs":[{"name":"in","event_time":"ts","schema":[
    {"name":"k","type":"int64"},{"name":"ts","type":"timestamp"}]}],
  "boxes":[{"id":"c","type":"aggregate","options":{"group_by":["k"],"window":{"type":"tumbling","size":"1h"},
    "aggregates":[{"fn":"count","as":"n"}]}}],
  "arcs":[{"from":"in","to":"c"}],"outputs":[{"name":"out","from":"c"}]})";

engine::Batch rows(int64_t first, int64_t n, int64_t ts) {
  engine::BatchBuilder b(kInSchema);
  for (int64_t i = 0; i < n; ++i) {
    b.column(0).ints.push_back(first + i);
    b.column(1).ints.push_back(ts);
    b.event_time().push_back(ts);
    b.seq().push_back(0);
  }
  return b.finish();
}

bool eventually(const std::function<bool()>& done, std::chrono::milliseconds limit = 20s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return done();
}

class FragmentTakeover : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = entente::testing::make_temp_dir("takeover-test"); }
  void TearDown() override {
    n1_.reset();
    n2_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::unique_ptr<NodeImpl> open_node(const std::string& name) {
    NodeConfig c;
    c.domain = "acme";
    c.node = name;
    c.tls = false;
    c.data_dir = dir_ + "/" + name;
    auto n = std::make_unique<NodeImpl>(c);
    Status s = n->open();
    EXPECT_TRUE(s.ok()) << s.error().message;
    return n;
  }

  static StreamMeta meta(const std::string& name, engine::SchemaPtr schema, const std::string& producer) {
    StreamMeta m;
    m.name = name;
    m.schema = std::move(schema);
    m.producer = producer;
    return m;
  }

  // The records of `from`'s `stream` whose last seq is <= `through`, copied
  // into `to`'s stream of the same name under the same numbers (what a
  // follower's copy holds).
  static void copy(NodeImpl& from, NodeImpl& to, const std::string& stream, uint64_t through = UINT64_MAX) {
    StreamPtr src = from.find_stream(stream), dst = to.find_stream(stream);
    ASSERT_TRUE(src && dst) << stream;
    std::vector<store::LogRecord> recs;
    ASSERT_TRUE(store::StreamLog::read(from.store(), src->meta().id, 0, 100000, 1u << 30, recs).ok());
    uint64_t next = 1;
    for (const auto& rec : recs) {
      if (rec.last > through) break;
      std::string_view p = rec.payload;
      auto b = engine::decode_batch(p);
      ASSERT_TRUE(b.ok()) << b.error().message;
      ASSERT_TRUE(dst->append_at(rec.first, std::move(b).value(), to.gc(), store::Admission::wait, nullptr).ok());
      next = rec.last + 1;
    }
    ASSERT_TRUE(eventually([&] { return dst->committed_next() == next; })) << stream;
  }

  // "k,n" per output row, in sequence order, with the seqs checked.
  static std::vector<std::string> output(NodeImpl& node) {
    StreamPtr s = node.find_stream("out");
    std::vector<std::string> out;
    if (!s) return out;
    std::vector<store::LogRecord> recs;
    EXPECT_TRUE(store::StreamLog::read(node.store(), s->meta().id, 0, 100000, 1u << 30, recs).ok());
    uint64_t next = 1;
    for (const auto& rec : recs) {
      EXPECT_EQ(rec.first, next);
      next = rec.last + 1;
      std::string_view p = rec.payload;
      auto b = engine::decode_batch(p);
      EXPECT_TRUE(b.ok());
      if (!b.ok()) break;
      for (size_t i = 0; i < b->rows(); ++i)
        out.push_back(std::to_string(b->columns[0]->ints[i]) + "," + std::to_string(b->columns[3]->ints[i]));
    }
    return out;
  }

  std::string dir_;
  std::unique_ptr<NodeImpl> n1_, n2_;
};

TEST_F(FragmentTakeover, AnotherNodeRecoversTheFragmentFromCopiesOfItsStateStreamAndOutputs) {
  n1_ = open_node("n1");
  ASSERT_TRUE(n1_->create_stream(meta("in", kInSchema, "api")).ok());
  NodeImpl::FragmentOf f;
  f.query = "q";
  f.fragment = "f";
  Diagnostics diag;
  auto q1 = n1_->deploy_query(kNetwork, diag, &f);
  ASSERT_TRUE(q1.ok()) << q1.error().message << " " << diag.to_string();
  EXPECT_EQ((*q1)->meta().state_stream, "q--f--state");
  StreamPtr state1 = n1_->find_stream("q--f--state");
  ASSERT_TRUE(state1);
  EXPECT_EQ(state1->meta().producer, "query:q");
  EXPECT_TRUE(is_internal_stream(state1->meta().name));

  StreamPtr in1 = n1_->find_stream("in");
  auto publish = [&](engine::Batch b) {
    ASSERT_TRUE(in1->append(std::move(b), n1_->gc(), store::Admission::wait, store::WriteBatch(), nullptr).ok());
  };
  // Window 1 closes (outputs 1..10), window 2 begins; a checkpoint.
  publish(rows(0, 10, 1000));
  publish(rows(0, 5, 2 * kHourMs + 1000));
  ASSERT_TRUE(eventually([&] { return (*q1)->info().positions[0] == 16; }));
  auto cp = (*q1)->drain_and_checkpoint();
  ASSERT_TRUE(cp.ok()) << cp.error().message;
  ASSERT_EQ(n1_->find_stream("out")->committed_next(), 11u);
  // After the checkpoint: window 2 closes (outputs 11..15).
  publish(rows(0, 5, 2 * kHourMs + 2000));
  publish(rows(0, 1, 4 * kHourMs));
  ASSERT_TRUE(eventually([&] { return n1_->find_stream("out")->committed_next() == 16; }));
  const std::vector<std::string> want = output(*n1_);
  ASSERT_EQ(want.size(), 15u);

  // n2 holds the input and the outputs (up to the checkpoint) as a
  // follower would; without the state stream it cannot take over.
  n2_ = open_node("n2");
  ASSERT_TRUE(n2_->create_stream(meta("in", kInSchema, "api")).ok());
  ASSERT_TRUE(n2_->create_stream(meta("out", n1_->find_stream("out")->meta().schema, "query:q")).ok());
  copy(*n1_, *n2_, "in");
  copy(*n1_, *n2_, "out", 10);
  NodeImpl::FragmentOf t = f;
  t.takeover = true;
  auto missing = n2_->deploy_query(kNetwork, diag, &t);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, Errc::not_found);
  EXPECT_NE(missing.error().message.find("state stream 'q--f--state'"), std::string::npos)
      << missing.error().message;
  EXPECT_FALSE(n2_->find_query("q--f"));

  // With its copy of the state stream: recovered, and the outputs after the
  // checkpoint reproduced under the same numbers.
  ASSERT_TRUE(n2_->create_stream(meta("q--f--state", state_stream_schema(), "query:q")).ok());
  copy(*n1_, *n2_, "q--f--state");
  n1_.reset();  // n1 "dies"
  auto q2 = n2_->deploy_query(kNetwork, diag, &t);
  ASSERT_TRUE(q2.ok()) << q2.error().message << " " << diag.to_string();
  auto info = (*q2)->info();
  EXPECT_EQ(info.state, "running");
  ASSERT_TRUE(info.checkpoint.has_value());
  EXPECT_EQ(info.checkpoint->id, cp->id);
  EXPECT_EQ(info.positions[0], 22u);
  ASSERT_TRUE(eventually([&] { return n2_->find_stream("out")->committed_next() == 16; }));
  EXPECT_EQ(output(*n2_), want);

  // It goes on from there on n2.
  StreamPtr in2 = n2_->find_stream("in");
  ASSERT_TRUE(in2->append(rows(7, 1, 4 * kHourMs + 1), n2_->gc(), store::Admission::wait, store::WriteBatch(), nullptr)
                  .ok());
  ASSERT_TRUE(in2->append(rows(0, 1, 6 * kHourMs), n2_->gc(), store::Admission::wait, store::WriteBatch(), nullptr)
                  .ok());
  ASSERT_TRUE(eventually([&] { return n2_->find_stream("out")->committed_next() == 18; }));
  // The query's meta persists with its state stream: n2 restarted loads it.
  n2_.reset();
  n2_ = open_node("n2");
  auto again = n2_->find_query("q--f");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->meta().state_stream, "q--f--state");
  EXPECT_EQ(again->info().positions[0], 24u);
}

}  // namespace
}  // namespace entente::broker::detail
