#include "broker/detail/federation_host.h"

#include <cstdio>
#include <map>
#include <mutex>

#include "broker/detail/node_impl.h"
#include "broker/detail/streams.h"
#include "cluster/membership.h"

namespace entente::broker::detail {
namespace {

// A federation tap as one of the stream's taps. Holds it weakly, as the
// stream holds its taps.
class TapAdapter final : public Tap {
 public:
  explicit TapAdapter(std::weak_ptr<federation::StreamTap> tap) : tap_(std::move(tap)) {}
  void on_record(const RecordPtr& rec) override {
    if (auto t = tap_.lock()) t->on_record({rec->first, rec->last, *rec->batch, rec->encoded.get()});
  }
  void on_stream_closed() override {
    if (auto t = tap_.lock()) t->on_stream_closed();
  }

 private:
  std::weak_ptr<federation::StreamTap> tap_;
};

// One of this node's streams as the federation layer sees it: up to its
// visible head, or, for the exporter serving one of its followers, up to
// its durable head (docs/cluster.md, "Replicated stream logs"). Keeps the
// adapters of the taps added through it, for as long as they are added.
class BrokerStream final : public federation::HostStream {
 public:
  BrokerStream(StreamPtr stream, NodeImpl& node, TapHead head = TapHead::visible)
      : s_(std::move(stream)), node_(node), head_(head) {}

  const std::string& name() const override { return s_->meta().name; }
  engine::SchemaPtr schema() const override { return s_->meta().schema; }
  uint64_t committed_next() const override {
    return head_ == TapHead::durable ? s_->committed_next() : s_->visible_next();
  }
  uint64_t next_seq() const override { return s_->next_seq(); }

  uint64_t add_tap(const std::shared_ptr<federation::StreamTap>& tap) override {
    auto adapter = std::make_shared<TapAdapter>(tap);
    {
      std::lock_guard lock(mu_);
      taps_[tap.get()] = adapter;
    }
    return s_->add_tap(adapter, head_);
  }
  void remove_tap(const federation::StreamTap* tap) override {
    std::shared_ptr<TapAdapter> adapter;
    {
      std::lock_guard lock(mu_);
      auto it = taps_.find(tap);
      if (it == taps_.end()) return;
      adapter = std::move(it->second);
      taps_.erase(it);
    }
    s_->remove_tap(adapter.get());
  }
  Status read_log(uint64_t from, size_t max_records, size_t max_bytes,
                  std::vector<store::LogRecord>& out) const override {
    return store::StreamLog::read(node_.store(), s_->meta().id, from, max_records, max_bytes, out);
  }
  Result<std::optional<uint64_t>> first_retained() const override {
    ENTENTE_ASSIGN_OR_RETURN(auto first, store::StreamLog::first(node_.store(), s_->meta().id));
    if (!first) return std::optional<uint64_t>();
    return std::optional<uint64_t>(first->first);
  }
  void named_batches(uint64_t first, uint64_t last, std::vector<federation::NamedBatch>& out) const override {
    std::vector<NamedRecord> named;
    s_->named_batches(first, last, named);
    out.reserve(out.size() + named.size());
    for (auto& n : named) out.push_back({std::move(n.tag.id), n.tag.seq, n.first, n.last, n.floor});
  }
  Status append_at(uint64_t first, engine::Batch batch, store::WriteBatch extra,
                   std::vector<federation::NamedBatch> named, std::function<void(const Status&)> done,
                   std::shared_ptr<const std::string> encoded) override {
    auto on_done = [done = std::move(done)](const Status& st, const RecordPtr&) { done(st); };
    if (named.empty()) {
      return s_->append_at(first, std::move(batch), node_.gc(), store::Admission::reject, std::move(extra),
                           std::move(on_done), std::move(encoded));
    }
    std::vector<NamedRecord> records;
    records.reserve(named.size());
    for (auto& n : named)
      records.push_back({ProducerTag{std::move(n.producer), n.producer_seq}, n.first, n.last, n.floor});
    return s_->append_at_named(first, std::move(batch), node_.gc(), store::Admission::reject,
                               std::move(extra), std::move(records), std::move(on_done), std::move(encoded));
  }
  void end_feed(const std::string& cause, const std::string& reason) override { s_->end_feed(cause, reason); }

 private:
  const StreamPtr s_;
  NodeImpl& node_;
  const TapHead head_;
  std::mutex mu_;
  std::map<const federation::StreamTap*, std::shared_ptr<TapAdapter>> taps_;  // REQUIRES: mu_
};

}  // namespace

store::Store& FederationHost::store() { return node_.store(); }

base::Registry& FederationHost::metrics() { return node_.metrics(); }

// The federation layer's lines start with their component ("federation: ",
// "contracts: ", "hosting: "), which becomes the line's component. A refused
// peer, message or stream is a refusal (collapsed when it repeats); a line
// saying something failed or was dropped is a warning.
void FederationHost::log(const std::string& line) {
  std::string_view text = line;
  std::string_view component = "federation";
  for (std::string_view c : {"federation", "contracts", "hosting"}) {
    if (text.size() > c.size() + 1 && text.starts_with(c) && text.substr(c.size(), 2) == ": ") {
      component = c;
      text.remove_prefix(c.size() + 2);
      break;
    }
  }
  if (text.starts_with("refused ")) {
    base::log_refusal(component, text);
    return;
  }
  const bool problem = text.find("failed") != std::string_view::npos ||
                       text.find("dropped") != std::string_view::npos ||
                       text.find("cannot") != std::string_view::npos;
  base::log(problem ? base::LogLevel::warn : base::LogLevel::info, component, text);
}

federation::HostStreamPtr FederationHost::find_stream(const std::string& name) {
  // (A hosted run's hidden streams are read by their owner alone, which
  // may_read_hosted decided before this is asked.)
  StreamPtr s = node_.find_stream(name);
  if (!s) s = node_.find_hosted_stream(name);
  return s ? std::make_shared<BrokerStream>(std::move(s), node_) : nullptr;
}

federation::HostStreamPtr FederationHost::find_stream_to_copy(const std::string& name, const std::string& node) {
  StreamPtr s = node_.find_stream(name);
  if (!s || !node_.is_follower(name, node)) return nullptr;
  return std::make_shared<BrokerStream>(std::move(s), node_, TapHead::durable);
}

std::vector<federation::HostStreamPtr> FederationHost::mirrors() {
  std::vector<federation::HostStreamPtr> out;
  for (auto& s : node_.list_streams()) {
    if (s->meta().producer == "import") out.push_back(std::make_shared<BrokerStream>(s, node_));
  }
  return out;
}

Result<federation::HostStreamPtr> FederationHost::create_mirror(const std::string& name,
                                                                engine::SchemaPtr schema) {
  StreamMeta meta;
  meta.name = name;
  meta.schema = std::move(schema);
  meta.producer = "import";
  const auto& r = node_.config().retention;
  meta.retention = {r.max_tuples, r.max_bytes, r.max_age_ms};
  // A copy of an owner's stream that a hosted run reads: hidden here.
  if (node_.hosted_mirror_wanted(name)) {
    ENTENTE_ASSIGN_OR_RETURN(StreamPtr h, node_.create_hidden_stream(std::move(meta), 1));
    return federation::HostStreamPtr(std::make_shared<BrokerStream>(std::move(h), node_));
  }
  ENTENTE_ASSIGN_OR_RETURN(StreamPtr s, node_.create_stream(std::move(meta)));
  return federation::HostStreamPtr(std::make_shared<BrokerStream>(std::move(s), node_));
}

Status FederationHost::submit(store::WriteBatch batch, std::function<void(const Status&)> done) {
  return node_.gc().submit(std::move(batch), std::move(done), store::Admission::reject);
}

std::optional<federation::StreamLocation> FederationHost::locate_stream(std::string_view name) const {
  if (!node_.membership_) return std::nullopt;  // a one-node domain
  const std::optional<std::string> leader = node_.stream_leader(std::string(name));
  if (!leader) return std::nullopt;
  // Led here by the catalog but not here yet: a failover just named this
  // node, which is making its copy the stream (reconcile_leadership).
  if (*leader == node_.config().node) return federation::StreamLocation{*leader, ""};
  // A leader that is down is still where the stream is: the importer waits
  // for its link rather than being told the stream does not exist.
  for (const auto& m : node_.membership_->view().members) {
    if (m.record.node == *leader && !m.record.peer_address.empty()) {
      return federation::StreamLocation{*leader, m.record.peer_address};
    }
  }
  return std::nullopt;
}

void FederationHost::on_internal_ack(const std::string& stream, const std::string&, uint64_t) {
  node_.on_replica_ack(stream);
}

void FederationHost::on_domain_ack(const std::string& stream, const std::string& domain, uint64_t through) {
  node_.on_hosted_ack(stream, domain, through);
}

bool FederationHost::may_read_hosted(const std::string& stream, const std::string& domain) {
  return node_.may_read_hosted(stream, domain);
}

void FederationHost::on_hosting(const certs::Identity& peer, const std::string& type, const std::string& message,
                                HostingAnswer answer) {
  node_.on_hosting(peer, type, message, std::move(answer));
}

}  // namespace entente::broker::detail
