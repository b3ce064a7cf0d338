#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// A deployed query: its engine Executor, driven by the engine worker pool,
// reading its input streams (live through taps, or from the log when it has
// fallen behind) and appending to its output streams.
//
// Exactly-once across restarts (docs/operations.md, "Recovery"): every input
// range the runner consumes is journaled, and the journal entries are written
// in the same atomic write as the first output record they lead to. A
// checkpoint holds the executor's snapshot, the input positions, the output
// sequence numbers and the journal position. Recovery restores the
// checkpoint, replays the journal in its original order (so the engine sees
// exactly the same pushes and produces exactly the same outputs), drops the
// outputs that are already in the log by sequence number, and continues.
//
// Threading: run_some() runs on an engine worker; at most one worker runs a
// runner at a time (mu_). info(), lag_tuples() and pin() may be called from
// any thread.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "broker/detail/streams.h"
#include "engine/network.h"
#include "store/group_commit.h"
#include "store/store.h"

namespace entente::broker::detail {

class QueryRunner;

// A fixed set of engine worker threads that run ready query runners.
// Lifecycle: constructed running; stop() joins (runners still queued are
// dropped: they are stopped by then).
class EnginePool final {
 public:
  explicit EnginePool(int threads);
  ~EnginePool();
  EnginePool(const EnginePool&) = delete;
  EnginePool& operator=(const EnginePool&) = delete;
  void schedule(std::shared_ptr<QueryRunner> runner);
  void stop();

 private:
  void work();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<QueryRunner>> ready_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

struct QueryMeta {
  std::string name;
  uint64_t id = 0;
  std::string network_json;
  std::vector<std::string> inputs;    // stream per network input, by index
  std::vector<std::string> outputs;   // stream per network output, by index
  std::vector<uint64_t> start;        // first position per input at deploy
  int64_t created_ms = 0;
  // A fragment of a query cut across nodes (docs/cluster.md, "Queries cut
  // into fragments"): the query and fragment names (empty for a whole
  // query), and which inputs and outputs are internal streams, whose rows
  // carry the producer's watermark (engine::internal_stream_schema).
  std::string query;
  std::string fragment;
  std::vector<uint32_t> internal_inputs;   // indexes into inputs
  std::vector<uint32_t> internal_outputs;  // indexes into outputs
};
std::string query_meta_to_json(const QueryMeta& m);
Result<QueryMeta> query_meta_from_json(std::string_view json);

struct CheckpointInfo {
  std::string query;
  uint64_t id = 0;
  uint64_t bytes = 0;
  int64_t taken_ms = 0;      // wall clock
  double duration_ms = 0;    // snapshot + durable write
};

struct QueryInfo {
  std::string state;  // "running", "failed: <why>"
  std::vector<engine::Executor::BoxInfo> boxes;
  // Per box, tuples in and out per second between the last two checkpoints
  // (empty before the second).
  std::vector<double> tuples_in_per_s, tuples_out_per_s;
  std::vector<uint64_t> positions;  // next input seq per input
  uint64_t lag_tuples = 0;
  std::optional<CheckpointInfo> checkpoint;
};

class QueryRunner final : public std::enable_shared_from_this<QueryRunner> {
 public:
  struct Env {
    store::Store* store = nullptr;
    store::GroupCommit* gc = nullptr;
    EnginePool* pool = nullptr;
    Registry* metrics = nullptr;
  };
  static Result<std::shared_ptr<QueryRunner>> create(QueryMeta meta,
                                                     std::vector<StreamPtr> inputs,
                                                     std::vector<StreamPtr> outputs, Env env);
  ~QueryRunner();

  // Restores the last checkpoint and replays the journal after it.
  // Call once, before start().
  Status recover();
  void start();
  // Removes the taps and waits for a running run_some to return.
  void stop();

  // Processes up to a bounded amount of input; reschedules itself when more
  // is waiting. Called by the pool.
  void run_some();

  // Takes a checkpoint at the next opportunity; `done` runs once it is
  // durable (or failed), on the group-commit thread.
  using CheckpointDone = std::function<void(const Result<CheckpointInfo>&)>;
  void request_checkpoint(CheckpointDone done);
  // Processes everything already committed on the inputs, then checkpoints,
  // on the calling thread; waits until the checkpoint is durable.
  Result<CheckpointInfo> drain_and_checkpoint();

  const QueryMeta& meta() const { return meta_; }
  QueryInfo info() const;
  uint64_t lag_tuples() const;
  // The smallest input position recovery may need for input `i`.
  uint64_t pin(size_t i) const { return pins_[i].load(std::memory_order_acquire); }
  // Removes the query's checkpoints and journal (query deleted).
  static void add_erase_state(store::WriteBatch& wb, const QueryMeta& meta);

 private:
  class InputTap;
  QueryRunner(QueryMeta meta, std::vector<StreamPtr> inputs, std::vector<StreamPtr> outputs,
              Env env);
  void schedule();
  // REQUIRES: mu_ held. Each returns false when it failed (state_ set).
  bool step(size_t input);
  bool flush_outputs(bool replaying);
  void take_checkpoint(std::vector<CheckpointDone> dones);
  Status read_range(size_t input, uint64_t first, uint64_t last, std::vector<engine::Batch>& out);
  // Pushes into the executor (an internal input's rows through
  // engine::push_internal), then marks each internal output whose
  // watermark moved. REQUIRES: mu_ held.
  void push_input(size_t input, engine::Batch&& batch);
  void fail(const std::string& why);

  friend class EnginePool;
  QueryMeta meta_;
  std::vector<StreamPtr> inputs_;
  std::vector<StreamPtr> outputs_;
  Env env_;
  engine::QueryNetwork network_;
  std::unique_ptr<engine::Executor> executor_;
  std::vector<std::shared_ptr<InputTap>> taps_;

  mutable std::mutex mu_;
  std::vector<uint64_t> pos_;              // REQUIRES: mu_
  std::vector<uint64_t> out_next_;         // REQUIRES: mu_
  std::vector<std::vector<engine::Batch>> pending_out_;  // REQUIRES: mu_
  // Per input: the network's schema when it is an internal stream, else null.
  std::vector<engine::SchemaPtr> internal_in_;
  // Per output: true when it is an internal stream.
  std::vector<bool> internal_out_;
  // Per internal output: the watermark of the last row or mark written.
  std::vector<engine::EventTime> out_watermark_;  // REQUIRES: mu_
  struct JournalEntry {
    uint32_t input;
    uint64_t first, last;
  };
  std::vector<JournalEntry> journal_pending_;  // REQUIRES: mu_
  uint64_t journal_next_ = 0;                  // REQUIRES: mu_
  uint64_t next_checkpoint_id_ = 1;            // REQUIRES: mu_
  size_t rr_ = 0;                              // REQUIRES: mu_ (round robin)
  std::vector<CheckpointDone> checkpoint_waiters_;  // REQUIRES: mu_
  std::string state_ = "running";              // REQUIRES: mu_
  std::optional<CheckpointInfo> last_checkpoint_;     // REQUIRES: cp_mu_
  // The boxes' counts at the last checkpoint, and the rates since the one
  // before (QueryInfo).
  struct RateSample {
    std::chrono::steady_clock::time_point at;
    std::vector<uint64_t> in, out;
  };
  std::optional<RateSample> rate_sample_;           // REQUIRES: mu_
  std::vector<double> rate_in_, rate_out_;          // REQUIRES: cp_mu_
  mutable std::mutex cp_mu_;

  std::unique_ptr<std::atomic<uint64_t>[]> positions_;  // mirror of pos_ for lag
  std::unique_ptr<std::atomic<uint64_t>[]> pins_;       // checkpointed positions
  std::atomic<bool> scheduled_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<bool> checkpoint_wanted_{false};
};

}  // namespace entente::broker::detail
