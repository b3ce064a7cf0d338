// The threaded scheduler (see engine/scheduler.h for the contract).
//
// Design: every box is an actor with an inbox (a FIFO of messages from all
// its input ports). A box is "scheduled" while it sits in the ready queue or
// a worker runs it; it is put there when it has messages and every inbox it
// feeds has room. Workers never wait except for work: a box that fills a
// downstream inbox simply is not scheduled again until that inbox drains,
// and the drain re-schedules it. One mutex guards all queue state; the box
// calls themselves run without it. That is deliberately simple (and easy
// for TSan to check): a message is a whole batch, so a lock round trip per
// message is noise beside the work in it.
#include "engine/scheduler.h"

#include <algorithm>
#include <cassert>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "engine/detail/network_def.h"
#include "engine/detail/network_runtime.h"

namespace entente::engine {

using detail::NetworkDef;
using detail::Target;

namespace {

struct Message {
  enum class Kind : uint8_t { batch, watermark, tick };
  Kind kind = Kind::batch;
  uint32_t port = 0;
  std::shared_ptr<const Batch> batch;  // Kind::batch; shared by fan-out
  // Kind::watermark: the watermark. Kind::batch: a watermark of the same
  // port that follows the batch (attached instead of queued separately), or
  // kMinTime.
  EventTime wm = kMinTime;
  int64_t now_ms = 0;  // Kind::tick

  size_t rows() const noexcept { return batch ? batch->rows() : 0; }
};

}  // namespace

struct Scheduler::Impl {
  struct Node;

  // Routes what a box emits. Used only by the worker running the box.
  struct NodeEmitter final : Emitter {
    Impl* impl = nullptr;
    uint32_t node = 0;
    int64_t sink_ns = 0;  // time in the sink during the current call
    void emit(size_t port, Batch batch) override { impl->emit_batch(*this, port, std::move(batch)); }
    void emit_watermark(EventTime wm) override { impl->emit_watermark(node, wm); }
  };

  struct Node {
    std::unique_ptr<Box> box;  // touched only by the worker running it
    NodeEmitter emitter;
    // Everything below: REQUIRES mu_.
    std::deque<Message> inbox;
    size_t inbox_rows = 0;
    size_t max_depth = 0;
    bool scheduled = false;  // in ready_ or being run
    bool fed_by_input = false;
    std::vector<uint32_t> downstream;  // distinct boxes this one feeds
    std::vector<uint32_t> upstream;    // distinct boxes feeding this one
    BoxStats stats;                    // published after each message
  };

  enum class State : uint8_t { accepting, finishing, stopped };

  std::shared_ptr<const NetworkDef> def;
  Sink sink;
  SchedulerOptions opts;
  std::vector<Node> nodes;
  std::vector<std::thread> threads;

  mutable std::mutex mu;
  std::condition_variable work_cv;   // ready queue non-empty, or exit
  std::condition_variable space_cv;  // an inbox fed by an input got room
  std::condition_variable idle_cv;   // nothing queued, nothing running
  std::deque<uint32_t> ready;        // REQUIRES mu
  std::vector<detail::InputClock> clocks;  // REQUIRES mu
  size_t queued = 0;                 // messages in all inboxes; REQUIRES mu
  size_t running = 0;                // boxes being run; REQUIRES mu
  State state = State::accepting;    // REQUIRES mu
  bool exit = false;                 // workers leave; REQUIRES mu

  std::mutex sink_mu;  // serialises sink calls
  std::mutex join_mu;  // one joiner at a time

  // REQUIRES: mu held (for all helpers up to `worker`).
  bool full(const Node& n) const {
    return n.inbox.size() >= opts.queue_batches || n.inbox_rows >= opts.queue_rows;
  }
  bool room_downstream(const Node& n) const {
    for (uint32_t d : n.downstream)
      if (full(nodes[d])) return false;
    return true;
  }
  void make_ready(uint32_t i) {
    Node& n = nodes[i];
    if (n.scheduled || n.inbox.empty() || exit || !room_downstream(n)) return;
    n.scheduled = true;
    ready.push_back(i);
    work_cv.notify_one();
  }
  void enqueue(uint32_t i, Message m) {
    Node& n = nodes[i];
    if (!n.inbox.empty()) {
      Message& back = n.inbox.back();
      // Attach a watermark to the batch just before it on the same port:
      // the box sees the same calls in the same order, one message fewer.
      if (m.kind == Message::Kind::watermark && back.kind == Message::Kind::batch && back.port == m.port &&
          back.wm == kMinTime) {
        back.wm = m.wm;
        return;
      }
      // Ticks carry no data: a newer one replaces one still waiting.
      if (m.kind == Message::Kind::tick && back.kind == Message::Kind::tick) {
        back.now_ms = m.now_ms;
        return;
      }
    }
    n.inbox_rows += m.rows();
    n.inbox.push_back(std::move(m));
    ++queued;
    n.max_depth = std::max(n.max_depth, n.inbox.size());
    make_ready(i);
  }
  // Node `i` went from full to not full: whoever waits for it may go on.
  void on_room(uint32_t i) {
    for (uint32_t u : nodes[i].upstream) make_ready(u);
    if (nodes[i].fed_by_input) space_cv.notify_all();
  }
  bool inputs_have_room(size_t input) const {
    for (const Target& t : def->input_targets[input])
      if (full(nodes[t.index])) return false;
    return true;
  }
  void enqueue_input(size_t input, const std::shared_ptr<const Batch>& batch, std::optional<EventTime> wm) {
    for (const Target& t : def->input_targets[input]) {
      if (batch && !batch->empty()) enqueue(t.index, Message{Message::Kind::batch, t.port, batch, kMinTime, 0});
      if (wm) enqueue(t.index, Message{Message::Kind::watermark, t.port, nullptr, *wm, 0});
    }
  }
  bool idle() const { return queued == 0 && running == 0; }

  // Called by the worker running `e.node`, without mu.
  void emit_batch(NodeEmitter& e, size_t port, Batch b) {
    assert(port < def->boxes[e.node].targets.size());
    const auto& targets = def->boxes[e.node].targets[port];
    auto shared = std::make_shared<const Batch>(std::move(b));
    bool to_outputs = false;
    {
      std::lock_guard lk(mu);
      if (state == State::stopped) return;
      for (const Target& t : targets) {
        if (t.kind == Target::Kind::box)
          enqueue(t.index, Message{Message::Kind::batch, t.port, shared, kMinTime, 0});
        else
          to_outputs = true;
      }
    }
    if (!to_outputs || !sink) return;
    int64_t t0 = detail::now_ns();
    {
      std::lock_guard lk(sink_mu);
      for (const Target& t : targets)
        if (t.kind == Target::Kind::output) sink(t.index, *shared);
    }
    e.sink_ns += detail::now_ns() - t0;
  }
  void emit_watermark(uint32_t node, EventTime wm) {
    std::lock_guard lk(mu);
    if (state == State::stopped) return;
    for (const auto& targets : def->boxes[node].targets)
      for (const Target& t : targets)
        if (t.kind == Target::Kind::box) enqueue(t.index, Message{Message::Kind::watermark, t.port, nullptr, wm, 0});
  }

  // Runs one message on node `i`'s box. Without mu; only this worker
  // touches the box now.
  void process(Node& n, const Message& m) {
    Box& box = *n.box;
    n.emitter.sink_ns = 0;
    int64_t t0 = detail::now_ns();
    switch (m.kind) {
      case Message::Kind::batch:
        box.stats().batches_in += 1;
        box.stats().tuples_in += m.batch->rows();
        box.on_batch(m.port, *m.batch, n.emitter);
        if (m.wm != kMinTime) box.on_watermark(m.port, m.wm, n.emitter);
        break;
      case Message::Kind::watermark:
        box.on_watermark(m.port, m.wm, n.emitter);
        break;
      case Message::Kind::tick:
        box.on_tick(m.now_ms, n.emitter);
        break;
    }
    int64_t own = detail::now_ns() - t0 - n.emitter.sink_ns;
    box.stats().cpu_ns += uint64_t(std::max<int64_t>(0, own));
  }

  void worker() {
    std::unique_lock lk(mu);
    for (;;) {
      work_cv.wait(lk, [&] { return exit || !ready.empty(); });
      if (exit) return;
      uint32_t i = ready.front();
      ready.pop_front();
      Node& n = nodes[i];
      ++running;
      bool requeued = false;
      for (size_t done = 0;;) {
        bool was_full = full(n);
        Message m = std::move(n.inbox.front());
        n.inbox.pop_front();
        n.inbox_rows -= m.rows();
        --queued;
        if (was_full && !full(n)) on_room(i);
        lk.unlock();
        process(n, m);
        m = Message{};  // release the batch outside the lock
        lk.lock();
        n.stats = n.box->stats();
        if (exit || n.inbox.empty() || !room_downstream(n)) break;
        if (++done >= opts.burst) {
          // Let other boxes run; this one stays scheduled.
          ready.push_back(i);
          work_cv.notify_one();
          requeued = true;
          break;
        }
      }
      if (!requeued) n.scheduled = false;
      --running;
      if (idle()) idle_cv.notify_all();
    }
  }

  void check_input(size_t input) const {
    if (input >= def->inputs.size())
      throw std::out_of_range("network '" + def->name + "' has " + std::to_string(def->inputs.size()) +
                              " inputs; there is no input " + std::to_string(input));
  }

  bool push(size_t input, const Batch& batch, bool wait) {
    check_input(input);
    const NetworkInput& in = def->inputs[input];
    // Stamping scans the time column for its maximum: done before taking
    // the lock.
    Batch scratch;
    EventTime max_t = kMinTime;
    const Batch& stamped = detail::stamp_input(in, batch, scratch, max_t);
    auto b = std::make_shared<const Batch>(&stamped == &scratch ? std::move(scratch) : batch);
    std::unique_lock lk(mu);
    if (wait) space_cv.wait(lk, [&] { return state != State::accepting || inputs_have_room(input); });
    if (state != State::accepting || !inputs_have_room(input)) return false;
    enqueue_input(input, b, clocks[input].observe(in, max_t));
    return true;
  }

  void join_all() {
    std::lock_guard jl(join_mu);
    for (auto& t : threads)
      if (t.joinable()) t.join();
    threads.clear();
  }
};

Scheduler::Scheduler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Scheduler::~Scheduler() { stop(); }

Result<std::unique_ptr<Scheduler>> Scheduler::create(const QueryNetwork& net, Sink sink, SchedulerOptions options) {
  if (net.def() == nullptr) return make_error(Errc::invalid_argument, "scheduler: empty query network");
  if (options.workers < 1 || options.workers > 1024)
    return make_error(Errc::invalid_argument, "scheduler: workers must be in [1, 1024]");
  if (options.queue_batches < 1 || options.queue_rows < 1 || options.burst < 1)
    return make_error(Errc::invalid_argument, "scheduler: queue_batches, queue_rows and burst must be >= 1");
  auto impl = std::make_unique<Impl>();
  impl->def = net.def();
  impl->sink = std::move(sink);
  impl->opts = options;
  ENTENTE_ASSIGN_OR_RETURN(auto boxes, detail::build_boxes(*impl->def));
  const NetworkDef& def = *impl->def;
  impl->nodes.resize(boxes.size());
  impl->clocks.resize(def.inputs.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    auto& n = impl->nodes[i];
    n.box = std::move(boxes[i]);
    n.emitter.impl = impl.get();
    n.emitter.node = uint32_t(i);
    for (const auto& targets : def.boxes[i].targets)
      for (const Target& t : targets)
        if (t.kind == Target::Kind::box) n.downstream.push_back(t.index);
    std::sort(n.downstream.begin(), n.downstream.end());
    n.downstream.erase(std::unique(n.downstream.begin(), n.downstream.end()), n.downstream.end());
    for (uint32_t d : n.downstream) impl->nodes[d].upstream.push_back(uint32_t(i));
  }
  for (const auto& targets : def.input_targets)
    for (const Target& t : targets) impl->nodes[t.index].fed_by_input = true;

  std::unique_ptr<Scheduler> s(new Scheduler(std::move(impl)));
  try {
    for (size_t w = 0; w < options.workers; ++w) s->impl_->threads.emplace_back([p = s->impl_.get()] { p->worker(); });
  } catch (const std::system_error& e) {
    s->stop();
    return make_error(Errc::limit_exceeded, std::string("scheduler: cannot start worker threads: ") + e.what());
  }
  return s;
}

bool Scheduler::push(size_t input, const Batch& batch) { return impl_->push(input, batch, true); }

bool Scheduler::try_push(size_t input, const Batch& batch) { return impl_->push(input, batch, false); }

bool Scheduler::advance_watermark(size_t input, EventTime wm) {
  impl_->check_input(input);
  std::unique_lock lk(impl_->mu);
  impl_->space_cv.wait(lk, [&] { return impl_->state != Impl::State::accepting || impl_->inputs_have_room(input); });
  if (impl_->state != Impl::State::accepting) return false;
  if (auto w = impl_->clocks[input].advance(wm)) impl_->enqueue_input(input, nullptr, w);
  return true;
}

void Scheduler::tick(int64_t now_ms) {
  std::lock_guard lk(impl_->mu);
  if (impl_->state != Impl::State::accepting) return;
  for (uint32_t i = 0; i < impl_->nodes.size(); ++i)
    impl_->enqueue(i, Message{Message::Kind::tick, 0, nullptr, kMinTime, now_ms});
}

void Scheduler::wait_idle() {
  std::unique_lock lk(impl_->mu);
  impl_->idle_cv.wait(lk, [&] { return impl_->idle(); });
}

void Scheduler::finish() {
  {
    std::unique_lock lk(impl_->mu);
    if (impl_->state == Impl::State::accepting) {
      impl_->state = Impl::State::finishing;
      impl_->space_cv.notify_all();  // waiting pushers give up
      // End every input. These few messages may overshoot a full inbox by
      // one each: finish() must not wait on the pushers it just refused.
      for (size_t i = 0; i < impl_->def->inputs.size(); ++i)
        if (auto w = impl_->clocks[i].advance(kMaxWatermark)) impl_->enqueue_input(i, nullptr, w);
    }
    impl_->idle_cv.wait(lk, [&] { return impl_->idle(); });
    impl_->exit = true;
    impl_->work_cv.notify_all();
  }
  impl_->join_all();
}

void Scheduler::stop() {
  {
    std::lock_guard lk(impl_->mu);
    impl_->state = Impl::State::stopped;
    impl_->exit = true;
    for (auto& n : impl_->nodes) {
      n.inbox.clear();
      n.inbox_rows = 0;
    }
    impl_->queued = 0;
    impl_->ready.clear();
    impl_->work_cv.notify_all();
    impl_->space_cv.notify_all();
    if (impl_->idle()) impl_->idle_cv.notify_all();
  }
  impl_->join_all();
}

std::vector<Scheduler::BoxInfo> Scheduler::stats() const {
  std::lock_guard lk(impl_->mu);
  std::vector<BoxInfo> out;
  out.reserve(impl_->nodes.size());
  for (size_t i = 0; i < impl_->nodes.size(); ++i) {
    const auto& n = impl_->nodes[i];
    out.push_back(BoxInfo{impl_->def->boxes[i].id, impl_->def->boxes[i].type, n.stats, n.inbox.size(),
                          n.inbox_rows, n.max_depth});
  }
  return out;
}

}  // namespace entente::engine
