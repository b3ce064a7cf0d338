// QueryNetwork (a validated definition) and the synchronous Executor.
#include "engine/network.h"

#include <cassert>
#include <stdexcept>

#include "engine/detail/network_def.h"
#include "engine/detail/network_runtime.h"

namespace entente::engine {

using detail::NetworkDef;
using detail::Target;

// ---------------------------------------------------------------------------
// QueryNetwork

Result<QueryNetwork> QueryNetwork::parse(std::string_view json, Diagnostics& diag) {
  ENTENTE_ASSIGN_OR_RETURN(auto def, detail::build_network_def(json, diag));
  QueryNetwork net;
  net.def_ = std::move(def);
  return net;
}

const std::string& QueryNetwork::name() const { return def_->name; }
const std::vector<NetworkInput>& QueryNetwork::inputs() const { return def_->inputs; }
const std::vector<NetworkOutput>& QueryNetwork::outputs() const { return def_->outputs; }

std::optional<size_t> QueryNetwork::input_index(std::string_view name) const {
  for (size_t i = 0; i < def_->inputs.size(); ++i)
    if (def_->inputs[i].name == name) return i;
  return std::nullopt;
}

std::optional<size_t> QueryNetwork::output_index(std::string_view name) const {
  for (size_t i = 0; i < def_->outputs.size(); ++i)
    if (def_->outputs[i].name == name) return i;
  return std::nullopt;
}

std::vector<std::string> QueryNetwork::box_ids() const {
  std::vector<std::string> ids;
  ids.reserve(def_->boxes.size());
  for (const auto& b : def_->boxes) ids.push_back(b.id);
  return ids;
}

// ---------------------------------------------------------------------------
// Executor
//
// Depth-first: a batch emitted by a box is handed to every downstream box
// before the emitting box continues, so the whole network runs inside the
// push() call and nothing is ever queued. CPU time is charged to a box
// exclusive of the downstream work nested inside its calls.

struct Executor::Impl {
  struct BoxEmitter final : Emitter {
    Impl* impl = nullptr;
    uint32_t box = 0;
    void emit(size_t port, Batch batch) override {
      assert(port < impl->def->boxes[box].targets.size());
      impl->route_batch(impl->def->boxes[box].targets[port], batch);
    }
    void emit_watermark(EventTime wm) override {
      for (const auto& targets : impl->def->boxes[box].targets) impl->route_watermark(targets, wm);
    }
  };

  std::shared_ptr<const NetworkDef> def;
  Sink sink;
  std::vector<uint32_t> output_box;  // per network output: the box it comes from
  std::vector<std::unique_ptr<Box>> boxes;
  std::vector<detail::InputClock> clocks;
  std::vector<BoxEmitter> emitters;
  // Time spent in calls nested inside the current box call (downstream
  // boxes and the sink), to be subtracted from its own.
  int64_t nested_ns = 0;
  // push(const Batch&)'s stamped copy, kept so its vectors are reused.
  Batch scratch;
  bool pushing = false;  // inside deliver(): scratch may be in use

  // Runs `call` on box `b`, charging its exclusive time to the box.
  template <class F>
  void timed(Box& b, F&& call) {
    int64_t saved = nested_ns;
    nested_ns = 0;
    int64_t t0 = detail::now_ns();
    call();
    int64_t elapsed = detail::now_ns() - t0;
    b.stats().cpu_ns += uint64_t(std::max<int64_t>(0, elapsed - nested_ns));
    nested_ns = saved + elapsed;
  }

  void route_batch(const std::vector<Target>& targets, const Batch& batch) {
    for (const Target& t : targets) {
      if (t.kind == Target::Kind::output) {
        int64_t t0 = detail::now_ns();
        if (sink) sink(t.index, batch);
        nested_ns += detail::now_ns() - t0;
        continue;
      }
      Box& b = *boxes[t.index];
      b.stats().batches_in += 1;
      b.stats().tuples_in += batch.rows();
      timed(b, [&] { b.on_batch(t.port, batch, emitters[t.index]); });
    }
  }

  void route_watermark(const std::vector<Target>& targets, EventTime wm) {
    for (const Target& t : targets) {
      if (t.kind == Target::Kind::output) continue;
      Box& b = *boxes[t.index];
      timed(b, [&] { b.on_watermark(t.port, wm, emitters[t.index]); });
    }
  }

  // Routes a stamped batch pushed into `input`, then the watermark it
  // advances. `max_t` is the batch's highest event time.
  void deliver(size_t input, const Batch& b, EventTime max_t) {
    const bool was_pushing = pushing;
    pushing = true;
    struct Restore {
      bool& flag;
      bool value;
      ~Restore() { flag = value; }
    } restore{pushing, was_pushing};
    const auto& targets = def->input_targets[input];
    if (!b.empty()) route_batch(targets, b);
    if (auto wm = clocks[input].observe(def->inputs[input], max_t)) route_watermark(targets, *wm);
  }

  void check_input(size_t input) const {
    if (input >= def->inputs.size())
      throw std::out_of_range("network '" + def->name + "' has " + std::to_string(def->inputs.size()) +
                              " inputs; there is no input " + std::to_string(input));
  }
};

Executor::Executor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Executor::~Executor() = default;

Result<std::unique_ptr<Executor>> Executor::create(const QueryNetwork& net, Sink sink) {
  if (net.def() == nullptr) return make_error(Errc::invalid_argument, "executor: empty query network");
  auto impl = std::make_unique<Impl>();
  impl->def = net.def();
  impl->sink = std::move(sink);
  ENTENTE_ASSIGN_OR_RETURN(impl->boxes, detail::build_boxes(*impl->def));
  impl->clocks.resize(impl->def->inputs.size());
  impl->output_box.resize(impl->def->outputs.size());
  for (size_t b = 0; b < impl->def->boxes.size(); ++b)
    for (const auto& targets : impl->def->boxes[b].targets)
      for (const Target& t : targets)
        if (t.kind == Target::Kind::output) impl->output_box[t.index] = uint32_t(b);
  impl->emitters.resize(impl->boxes.size());
  for (size_t b = 0; b < impl->emitters.size(); ++b) {
    impl->emitters[b].impl = impl.get();
    impl->emitters[b].box = uint32_t(b);
  }
  return std::unique_ptr<Executor>(new Executor(std::move(impl)));
}

void Executor::push(size_t input, const Batch& batch) {
  impl_->check_input(input);
  const NetworkInput& in = impl_->def->inputs[input];
  // The stamped copy reuses the executor's buffers, unless a sink pushes
  // from inside a push (then the outer call is still using them).
  Batch local;
  Batch& scratch = impl_->pushing ? local : impl_->scratch;
  EventTime max_t = kMinTime;
  const Batch& b = detail::stamp_input(in, batch, scratch, max_t);
  impl_->deliver(input, b, max_t);
  // Keep no reference to the caller's data.
  scratch.columns.clear();
  scratch.event_time = {};
  scratch.seq = {};
}

void Executor::push(size_t input, Batch&& batch) {
  impl_->check_input(input);
  const EventTime max_t = detail::stamp_input_in_place(impl_->def->inputs[input], batch);
  impl_->deliver(input, batch, max_t);
}

void Executor::advance_watermark(size_t input, EventTime wm) {
  impl_->check_input(input);
  if (auto w = impl_->clocks[input].advance(wm)) impl_->route_watermark(impl_->def->input_targets[input], *w);
}

void Executor::finish() {
  for (size_t i = 0; i < impl_->def->inputs.size(); ++i) advance_watermark(i, kMaxWatermark);
}

void Executor::tick(int64_t now_ms) {
  for (size_t b = 0; b < impl_->boxes.size(); ++b) {
    Box& box = *impl_->boxes[b];
    impl_->timed(box, [&] { box.on_tick(now_ms, impl_->emitters[b]); });
  }
}

EventTime Executor::output_watermark(size_t output) const {
  if (output >= impl_->output_box.size())
    throw std::out_of_range("network '" + impl_->def->name + "' has " + std::to_string(impl_->output_box.size()) +
                            " outputs; there is no output " + std::to_string(output));
  // The box's own record: its watermark goes to every port it has, and
  // restore() brings it back with the box's state.
  return impl_->boxes[impl_->output_box[output]]->output_watermark();
}

std::vector<Executor::BoxInfo> Executor::box_stats() const {
  std::vector<BoxInfo> out;
  out.reserve(impl_->boxes.size());
  for (size_t b = 0; b < impl_->boxes.size(); ++b)
    out.push_back(BoxInfo{impl_->def->boxes[b].id, impl_->def->boxes[b].type, impl_->boxes[b]->stats()});
  return out;
}

std::string Executor::snapshot() const {
  std::string out;
  detail::write_network_snapshot(*impl_->def, impl_->clocks, impl_->boxes, out);
  return out;
}

Status Executor::restore(std::string_view bytes, const KeyGroupRange* keep) {
  std::vector<detail::InputClock> clocks;
  std::vector<std::unique_ptr<Box>> boxes;
  ENTENTE_RETURN_IF_ERROR(detail::read_network_snapshot(*impl_->def, bytes, clocks, boxes, keep));
  // Statistics count the work this executor did; a restore does not undo it.
  for (size_t b = 0; b < boxes.size(); ++b) boxes[b]->stats() = impl_->boxes[b]->stats();
  impl_->clocks = std::move(clocks);
  impl_->boxes = std::move(boxes);
  return Status::Ok();
}

}  // namespace entente::engine
