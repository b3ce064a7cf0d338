// Runs a query network on a pool of worker threads, with a bounded queue in
// front of every box.
//
// Ownership and threading: a Scheduler owns its boxes and its worker
// threads; every thread it starts is joined by finish(), stop() or the
// destructor. Each box runs on at most one worker at a time and receives
// its messages (batches, watermarks, ticks) in exactly the order its
// upstreams produced them, so the rows reaching each output are the same,
// in the same order and with the same sequence numbers, as with the
// synchronous Executor for the same pushes (batch boundaries may differ
// where a multi-input box releases rows at other moments). push(),
// try_push(), advance_watermark(), tick() and stats() may be called from
// any threads.
//
// Backpressure: a box's queue holds at most `queue_batches` messages or
// `queue_rows` rows. A box is only scheduled while every queue it feeds
// has room, and a push waits while a queue it feeds is full, so a slow box
// slows the pusher instead of growing memory. A running box may overshoot a
// downstream queue by what one message makes it emit (a box never blocks
// inside a call, which is what keeps a small pool free of deadlock).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/network.h"

namespace entente::engine {

struct SchedulerOptions {
  size_t workers = 2;           // worker threads, >= 1
  size_t queue_batches = 64;    // messages per box queue, >= 1
  size_t queue_rows = 1u << 20; // rows per box queue, >= 1
  // Messages a worker handles for one box before it lets other boxes run.
  size_t burst = 16;
};

class Scheduler final {
 public:
  // Called for each batch reaching network output `output`. Calls are
  // serialised (never two at once) and, per output, in order.
  using Sink = Executor::Sink;

  struct BoxInfo {
    std::string id;
    std::string type;
    BoxStats stats;          // as of the last message the box finished
    size_t queue_depth = 0;  // messages waiting now
    size_t queue_rows = 0;   // rows waiting now
    size_t max_queue_depth = 0;
  };

  // Builds every box and starts the workers.
  static Result<std::unique_ptr<Scheduler>> create(const QueryNetwork& net, Sink sink,
                                                   SchedulerOptions options = {});
  // stop() if neither finish() nor stop() ran.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Feeds a batch into input `input`, waiting while a queue it feeds is
  // full. Event times and the automatic watermark as in Executor::push.
  // Returns false (and drops the batch) once the scheduler is finishing or
  // stopped. Throws std::out_of_range / std::invalid_argument for a bad
  // input index or a batch of the wrong schema (programming errors).
  bool push(size_t input, const Batch& batch);
  // As push(), but returns false at once instead of waiting.
  bool try_push(size_t input, const Batch& batch);
  // Advances input's watermark (ignored unless higher); waits for room.
  bool advance_watermark(size_t input, EventTime wm);
  // Processing-time tick to every box. Never waits: a tick queued behind
  // another tick replaces it.
  void tick(int64_t now_ms);

  // Waits until every queue is empty and no box is running: everything
  // pushed so far has reached the outputs.
  void wait_idle();
  // Ends every input (watermark kMaxWatermark), drains, and joins the
  // workers. Further pushes return false.
  void finish();
  // Discards what is queued, waits for running boxes to return, and joins
  // the workers.
  void stop();

  std::vector<BoxInfo> stats() const;

 private:
  struct Impl;
  explicit Scheduler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace entente::engine
