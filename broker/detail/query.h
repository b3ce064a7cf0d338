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
// Where the journal and the checkpoints live. A whole query (and a
// single-node broker) keeps them in the node's store: journal entries in
// the log family (written atomically with the output record they lead to),
// checkpoints in store::Checkpoints. A fragment of a cut query keeps both in
// its hidden *state stream* (QueryMeta::state_stream, "QUERY--FRAGMENT--state";
// docs/cluster.md, "A fragment's state stream"), an ordinary stream whose
// followers the domain gives it, so that another node holding a copy can
// run the same recovery. Its rows (state_stream_schema()):
//
//   kind  a            b            c            d              data
//   1     journal seq  input index  first seq    last seq       ""
//   2     checkpoint   chunk index  chunk count  journal_next   chunk bytes
//
// A checkpoint is its snapshot bytes (as store::Checkpoints would hold
// them) cut into chunks of at most kStateChunkBytes, one append per chunk,
// after the journal entries it covers, and only once the outputs written
// before it are held by their own in-sync followers (a node taking over
// reproduces only the outputs after the checkpoint its copy holds).
// Outputs wait for the state stream:
// before appending output records, the runner waits until the journal rows
// that led to them are durable here and held by every in-sync follower of
// the state stream (Env::when_replicated), so any copy of an output has its
// journal in every in-sync copy of the state stream. Once a checkpoint is
// durable and replicated, the records before its first chunk are not
// needed: state_trim_before() says where the node may erase up to.
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
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "broker/detail/cpu_load.h"
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
  // The fragment's state stream (journal and checkpoints); empty for a
  // whole query, which keeps them in the store (see above).
  std::string state_stream;
  // Stopped by POST /v1/queries/{name}/stop (a whole query on a node
  // without a cluster section): recovered at start-up but not started.
  bool stopped = false;
};
std::string query_meta_to_json(const QueryMeta& m);
// The name of the state stream of the runner named `runner` (QUERY--FRAGMENT).
std::string state_stream_name(const std::string& runner);
// The schema of a state stream: kind, a, b, c, d (int64), data (string,
// raw bytes: the engine's binary encoding carries any bytes). Row layout
// above.
engine::SchemaPtr state_stream_schema();
inline constexpr int64_t kStateJournal = 1;
inline constexpr int64_t kStateCheckpoint = 2;
// What a replay says when an input's copy on this node does not hold the
// range yet (it is being copied): an "unavailable" error with this text.
inline constexpr const char* kNotCopiedYet = "is not in this node's copy yet";

// Bytes of snapshot per checkpoint row: one row per append keeps a record
// well under the federation frame limit (1 MiB) when followers copy it.
inline constexpr size_t kStateChunkBytes = 256u << 10;

// Follows the checkpoint chunks of a state stream read record by record (a
// follower's copy, which has no runner to say where it may be trimmed):
// the first seq of the last checkpoint whose chunks were all seen.
class StateCheckpoints final {
 public:
  // REQUIRES: records in order. corrupt when `rec` is not a state record.
  Status feed(const store::LogRecord& rec);
  uint64_t last_complete_first() const { return complete_first_; }

 private:
  uint64_t id_ = 0, count_ = 0, chunks_ = 0, first_ = 0;
  bool reading_ = false;
  uint64_t complete_first_ = 0;
};
Result<QueryMeta> query_meta_from_json(std::string_view json);

struct CheckpointInfo {
  std::string query;
  uint64_t id = 0;
  uint64_t bytes = 0;
  int64_t taken_ms = 0;      // wall clock
  double duration_ms = 0;    // snapshot + durable write
};

struct QueryInfo {
  std::string state;  // "running", "stopped", "failed: <why>"
  std::vector<engine::Executor::BoxInfo> boxes;
  // Per box, tuples in and out per second between the last two checkpoints
  // (empty before the second).
  std::vector<double> tuples_in_per_s, tuples_out_per_s;
  std::vector<uint64_t> positions;  // next input seq per input
  uint64_t lag_tuples = 0;
  std::optional<CheckpointInfo> checkpoint;
  // The runner's load (cpu_load.h): CPU ms per second over the last
  // kLoadWindowSeconds, and CPU seconds since it started on this node.
  double cpu_ms_per_s = 0;
  double cpu_seconds = 0;
};

class QueryRunner final : public std::enable_shared_from_this<QueryRunner> {
 public:
  struct Env {
    store::Store* store = nullptr;
    store::GroupCommit* gc = nullptr;
    EnginePool* pool = nullptr;
    Registry* metrics = nullptr;
    // Calls `release` once every in-sync follower of `stream` holds tuple
    // `last` (NodeImpl::when_replicated); an error when it cannot be had
    // (this node does not lead the stream, etcd unreachable). `release`
    // may run on any thread (a link thread): it must not block. Null:
    // released at once.
    using WhenReplicated =
        std::function<void(const std::string& stream, uint64_t last, std::function<void(const Status&)> release)>;
    WhenReplicated when_replicated;
  };
  // `state`: the state stream meta.state_stream names (null when it names
  // none).
  static Result<std::shared_ptr<QueryRunner>> create(QueryMeta meta,
                                                     std::vector<StreamPtr> inputs,
                                                     std::vector<StreamPtr> outputs, Env env,
                                                     StreamPtr state = nullptr);
  ~QueryRunner();

  // Restores the last checkpoint and replays the journal after it (from
  // the store, or from the state stream's local log when there is one).
  // Call once, before start(). An input tuple the replay needs that the
  // input's log does not hold yet (a mirror still catching up) is
  // Errc::unavailable: recovery may succeed later; one the log holds no
  // more (it starts after it) is Errc::conflict: it never will.
  Status recover();
  void start();

  // Warm standby: the target of a move (docs/cluster.md, "Moving a
  // fragment") runs the fragment over its follower copies of the state
  // stream and outputs while the source still runs, so that the state is
  // rebuilt before the pause, not during it. Made with begin_warm()
  // instead of recover(), never started: each warm() reads what the state
  // stream copy gained since the last call and replays its journal
  // entries (the last checkpoint first, on the first call), writing
  // nothing: the outputs they produce are counted, not appended (the
  // copies hold them). Errors: unavailable (an input range not here yet,
  // call again), conflict (the copy lost records this standby had not
  // read, or it ended: build a new one), corrupt. One thread calls warm().
  void begin_warm();
  Result<uint64_t> warm();  // the next journal entry the standby needs
  // Ends the standby once this node leads the streams (`outputs`, `state`:
  // the copies it read, adopted under their own names, same logs; `inputs`:
  // the very streams it read): the rest of the journal is replayed, and
  // the outputs must end where the standby's count does, else an error
  // (the caller recovers a new runner the ordinary way). Then start().
  Status promote(const std::vector<StreamPtr>& inputs, std::vector<StreamPtr> outputs, StreamPtr state);
  // Ends a standby that read a copy of another domain's state stream (a
  // fragment moved to a node of another domain, docs/cluster.md, "Moving a
  // fragment to another domain"): the rest of the copy's journal is
  // replayed, up to `journal_next` (the owner's, where its runner
  // stopped); then the runner writes to `outputs` and `state` instead,
  // named `output_names` and `state_name`, streams that start where the
  // owner's end. unavailable: the copy or an input does not hold all of it
  // yet (call again); conflict: the standby did not reproduce the owner's
  // run exactly (the journal's length, or where an output starts). Then
  // start().
  Status promote_to(uint64_t journal_next, std::vector<StreamPtr> outputs, std::vector<std::string> output_names,
                    StreamPtr state, std::string state_name);
  // The next journal entry (the journal's length), for a move to compare
  // the standby's progress with (any thread).
  uint64_t journal_next() const {
    std::lock_guard lock(mu_);
    return journal_next_;
  }
  // Removes the taps and waits for a running run_some to return.
  void stop();
  // POST /v1/queries/{name}/stop: stop(), then everything it consumed
  // written to its outputs and a checkpoint taken where it stands, durable
  // when this returns; info() says "stopped". A runner whose meta says
  // `stopped` is like that from start(). conflict unless running.
  Result<CheckpointInfo> pause();
  // Before start(): the runner starts stopped, as if its meta said so (a
  // fragment of a stopped query taken over, or its warm standby promoted).
  void keep_stopped() { meta_.stopped = true; }
  // A checkpoint of where the runner stands into `wb` (replacing a
  // query's network: the new network's first checkpoint, in the write
  // that replaces it). REQUIRES: a whole query's runner, not started.
  void add_checkpoint(store::WriteBatch& wb);

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

  // Splitting a fragment (docs/cluster.md, "Splitting a fragment"). What
  // the runner holds: every row it produced flushed to its outputs first,
  // then its next input positions, next output sequence numbers and
  // executor snapshot. After stop(), where it stopped; on a running runner
  // whose inputs get nothing more (a part of a split being merged back),
  // where it stands. conflict when the runner failed. Every row out_next
  // counts is in its output's log when it returns (it waits up to 10 s for
  // appends in flight; unavailable when they do not land), so a runner
  // seeded with it continues each output exactly there.
  struct State {
    std::vector<uint64_t> positions;
    std::vector<uint64_t> out_next;
    std::string snapshot;  // engine::Executor::snapshot
    // The next journal entry and checkpoint id (stopped_state fills them).
    uint64_t journal_next = 0;
    uint64_t next_checkpoint_id = 0;
  };
  // Without `with_snapshot` the snapshot is left empty (a move whose target
  // rebuilt the state already: the pause does not grow with it).
  Result<State> stopped_state(bool with_snapshot = true);
  // Instead of recover(), before start(): the runner continues from
  // `state` (a fragment made by a split: its positions, output sequence
  // numbers and a snapshot carried from the split fragment's; an empty
  // snapshot leaves the executor fresh). invalid_argument when the sizes
  // do not match the runner's inputs and outputs, or the snapshot does not
  // restore.
  // `continue_journal`: the journal and checkpoint ids go on from the
  // state's (a fragment hosted in another domain, whose journal and
  // checkpoints follow its own in the owner's state stream).
  Status seed(const State& state, bool continue_journal = false);

  const QueryMeta& meta() const { return meta_; }
  QueryInfo info() const;
  uint64_t lag_tuples() const;
  // The smallest input position recovery may need for input `i`.
  uint64_t pin(size_t i) const { return pins_[i].load(std::memory_order_acquire); }
  // The state stream (null without one).
  const StreamPtr& state_stream() const { return state_log_; }
  // The first seq of the state stream recovery needs: the first chunk of
  // the last checkpoint taken (durable and replicated); 0 before one.
  // Records before it may be erased (store::StreamLog::erase_before).
  uint64_t state_trim_before() const { return state_trim_.load(std::memory_order_acquire); }
  // Removes the query's checkpoints and journal (query deleted).
  static void add_erase_state(store::WriteBatch& wb, const QueryMeta& meta);

 private:
  class InputTap;
  struct JournalEntry {
    uint32_t input;
    uint64_t first, last;
  };
  QueryRunner(QueryMeta meta, std::vector<StreamPtr> inputs, std::vector<StreamPtr> outputs,
              Env env);
  void schedule();
  // REQUIRES: mu_ held. Each returns false when it failed (state_ set).
  bool step(size_t input);
  bool flush_outputs(bool replaying);
  void take_checkpoint(std::vector<CheckpointDone> dones);
  std::string checkpoint_head() const;
  // State-stream mode (REQUIRES: mu_ held, state_log_ set).
  // The pending journal as state rows; empty when none.
  std::optional<engine::Batch> journal_rows();
  // Appends `rows` and waits until they are durable here and released by
  // when_replicated; false when that failed (the runner failed).
  bool append_state_and_wait(engine::Batch rows);
  // Appends `rows` without waiting; a failure fails the runner at its next
  // flush (state_failure_).
  bool append_state(engine::Batch rows);
  // Blocks until `stream`'s in-sync followers hold `last` (Env::
  // when_replicated, "unavailable" asked again within bounds).
  Status wait_replicated(const std::string& stream, uint64_t last);
  // The snapshot as chunk rows; the checkpoint counts once the last one is
  // durable and released.
  void checkpoint_to_state(const std::string& bytes, uint64_t id, CheckpointInfo info,
                           std::vector<uint64_t> positions, std::chrono::steady_clock::time_point t0,
                           std::vector<CheckpointDone> dones);
  // Reads the state stream: restores its last complete checkpoint and
  // returns the journal entries after it, in order; `end` gets the seq
  // after the last record read.
  Status load_state(std::vector<std::pair<uint64_t, JournalEntry>>& entries, uint64_t* end = nullptr);
  // Replays journal entries in order from the front of `entries`, popping
  // each one done (so a call that stops on a missing input range resumes
  // where it stopped).
  Status replay(std::deque<std::pair<uint64_t, JournalEntry>>& entries);
  // The warm standby reads the state stream records from warm_from_.
  Status warm_read();
  std::vector<CheckpointDone> take_waiters();  // REQUIRES: mu_
  // The checkpoint bytes restored (either mode).
  Status restore_snapshot(uint64_t id, std::string_view bytes);
  // A checkpoint became durable (and replicated): pins, info, metrics,
  // then `dones`. Any thread; does not take mu_.
  void checkpoint_taken(CheckpointInfo info, const std::vector<uint64_t>& positions,
                        std::chrono::steady_clock::time_point t0, std::vector<CheckpointDone>& dones);
  // True (and the runner failed) when a state append failed meanwhile.
  bool state_failed();
  // Input `input`'s tuples first..last from its log; a missing tuple as
  // recover() says.
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
  StreamPtr state_log_;  // the state stream, or null
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
  std::vector<JournalEntry> journal_pending_;  // REQUIRES: mu_
  uint64_t journal_next_ = 0;                  // REQUIRES: mu_
  uint64_t next_checkpoint_id_ = 1;            // REQUIRES: mu_
  size_t rr_ = 0;                              // REQUIRES: mu_ (round robin)
  std::vector<CheckpointDone> checkpoint_waiters_;  // REQUIRES: mu_
  std::string state_ = "running";              // REQUIRES: mu_
  // Warm standby (begin_warm): outputs are counted, not written.
  bool warm_ = false;                          // REQUIRES: mu_
  bool warm_loaded_ = false;                   // REQUIRES: mu_ (its checkpoint restored)
  uint64_t warm_from_ = 0;                     // REQUIRES: mu_ (next state seq to read)
  uint64_t warm_expect_ = 0;                   // REQUIRES: mu_ (next journal seq to queue)
  std::deque<std::pair<uint64_t, JournalEntry>> warm_pending_;  // REQUIRES: mu_
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
  // What info() read last under mu_ (state, boxes, positions), for the
  // calls that come while a run holds mu_.
  mutable std::mutex info_mu_;
  mutable QueryInfo info_cache_;  // REQUIRES: info_mu_
  // When run_some last refreshed info_cache_ (at most every kInfoRefresh).
  static constexpr std::chrono::milliseconds kInfoRefresh{100};
  std::chrono::steady_clock::time_point info_refreshed_{};  // REQUIRES: mu_

  std::unique_ptr<std::atomic<uint64_t>[]> positions_;  // mirror of pos_ for lag
  std::unique_ptr<std::atomic<uint64_t>[]> pins_;       // checkpointed positions
  std::atomic<bool> scheduled_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<bool> checkpoint_wanted_{false};
  std::atomic<uint64_t> state_trim_{0};
  CpuLoad cpu_load_;  // run_some's CPU time (its own lock)
  // Set from a state append's callback when it failed; read under mu_.
  std::mutex state_failure_mu_;
  std::string state_failure_;  // REQUIRES: state_failure_mu_
};

}  // namespace entente::broker::detail
