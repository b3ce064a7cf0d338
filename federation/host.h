#pragma once
// What the federation layer needs of the node it runs in, and nothing more
// (docs/architecture.md, "Modules and dependencies"): streams to export
// (their schema, their log, a tap on their committed records), mirrors to
// append to durably, the store (the `meta` family and the contracts
// ledger), metrics and a log. The broker implements it over its streams,
// group commit and store; unit tests implement it in memory over a real
// store. Nothing here knows the broker.
//
// Threading: every call may come from any thread (the link io thread, the
// federation timer, API threads); implementations are thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/metrics.h"
#include "base/result.h"
#include "certs/certs.h"
#include "engine/batch.h"
#include "engine/types.h"
#include "federation/messages.h"
#include "store/store.h"
#include "store/stream_log.h"

namespace entente::federation {

// One durable record of a stream as a tap sees it: tuples first..last,
// valid during the call only.
struct RecordView {
  uint64_t first = 0;
  uint64_t last = 0;
  const engine::Batch& batch;        // sequence numbers first..last
  const std::string* encoded;        // the batch's engine encoding, when kept
};

// Follows a stream's committed records (an export's channel). on_record
// runs one call at a time, in sequence order, with no gaps, on the
// committer thread or the thread that made the records visible: it must be
// short and must not block.
class StreamTap {
 public:
  virtual ~StreamTap() = default;
  virtual void on_record(const RecordView& record) = 0;
  // The stream is being deleted.
  virtual void on_stream_closed() = 0;
};

// A stream of this node: one this node owns (to export) or a mirror of
// another domain's stream (to import into).
class HostStream {
 public:
  virtual ~HostStream() = default;
  virtual const std::string& name() const = 0;
  virtual engine::SchemaPtr schema() const = 0;
  // The next sequence number to become visible to this handle's reader (1
  // + the last it may read): what the stream's in-sync followers hold, or,
  // for a follower's own copy (Host::find_stream_to_copy), what the log
  // holds.
  virtual uint64_t committed_next() const = 0;
  // The next sequence number an append takes, appends in flight included.
  virtual uint64_t next_seq() const = 0;

  // Records reaching committed_next() from the call on reach `tap`;
  // returns that head at that moment. The stream holds the tap weakly.
  virtual uint64_t add_tap(const std::shared_ptr<StreamTap>& tap) = 0;
  virtual void remove_tap(const StreamTap* tap) = 0;
  // Up to `max_records` records from the one holding `from` on, stopping
  // once `max_bytes` of payload are read (at least one record).
  virtual Status read_log(uint64_t from, size_t max_records, size_t max_bytes,
                          std::vector<store::LogRecord>& out) const = 0;
  // The first tuple the log still holds; nullopt when it holds none.
  virtual Result<std::optional<uint64_t>> first_retained() const = 0;
  // Appends to `out` the batches publishers named (docs/api.md, "Publishing
  // exactly once") that the stream remembers and whose last tuple is in
  // first..last, by ascending last, each with its producer's floor: what a
  // DATA_NAMED covering first..last carries (docs/protocol.md §5.12).
  virtual void named_batches(uint64_t first, uint64_t last, std::vector<NamedBatch>& out) const = 0;

  // A mirror: appends tuples first.. of the owner's numbering (see
  // append_at in docs/federation.md: `first` is next_seq(), or anything
  // while the mirror never held a tuple), with `extra` in the same atomic
  // write; `done` runs once it is durable (or failed). `named`: batches the
  // owner's publishers named whose last tuple is among these (a copy of a
  // stream of this domain, docs/cluster.md): the mirror remembers them as
  // the owner does, written in the same atomic write, so that it answers a
  // retry of one as the owner would. `encoded`, when given, is the batch's
  // engine encoding exactly as it is. Errors: unavailable (the write queue
  // is full, or the mirror is going), conflict (a wrong `first`).
  virtual Status append_at(uint64_t first, engine::Batch batch, store::WriteBatch extra,
                           std::vector<NamedBatch> named, std::function<void(const Status&)> done,
                           std::shared_ptr<const std::string> encoded) = 0;
  // A mirror whose owner refused or ended the import: its live readers
  // learn why nothing more comes (`cause` in a few words, first thing).
  virtual void end_feed(const std::string& cause, const std::string& reason) = 0;
};
using HostStreamPtr = std::shared_ptr<HostStream>;

// Where another node of this domain leads a stream (a domain of several
// nodes, docs/cluster.md): its name and its peer link's "host:port".
struct StreamLocation {
  std::string node;
  std::string peer_address;
};

class Host {
 public:
  virtual ~Host() = default;

  // The node's store: the `meta` family (acknowledged positions, unbilled
  // ranges, import positions) and the contracts ledger.
  virtual store::Store& store() = 0;
  virtual base::Registry& metrics() = 0;
  // One line, no trailing newline.
  virtual void log(const std::string& line) = 0;

  // A stream of this node by its local name ("bids", or "acme/bids" for a
  // mirror); null when there is none.
  virtual HostStreamPtr find_stream(const std::string& name) = 0;
  // The stream `name` as node `node` of this domain copies it when it is
  // one of the stream's followers (docs/cluster.md, "Replicated stream
  // logs"): read up to what the log holds, not up to what the followers
  // hold, so that the copy never waits on itself. null when `node` is not
  // one of its followers (it reads find_stream's).
  virtual HostStreamPtr find_stream_to_copy(const std::string& name, const std::string& node) {
    (void)name;
    (void)node;
    return nullptr;
  }
  // Every mirror in the catalog (at start-up: the imports to resume).
  virtual std::vector<HostStreamPtr> mirrors() = 0;
  // Creates the mirror `name` ("acme/bids") with the owner's schema, in
  // the catalog, durably.
  virtual Result<HostStreamPtr> create_mirror(const std::string& name, engine::SchemaPtr schema) = 0;
  // Writes `batch` in the order of the mirrors' appends (through the same
  // queue); `done` runs once it is durable. unavailable when the queue is
  // full.
  virtual Status submit(store::WriteBatch batch, std::function<void(const Status&)> done) = 0;

  // In a domain of several nodes: the node that leads `name` (a stream of
  // this domain this node does not have) and where its peer link listens,
  // so that an OPEN for it is answered with where it is; this node itself
  // (no address needed) when the domain names it the leader but the
  // stream is not ready here yet (a failover just named it). nullopt when
  // no node leads it (a one-node domain, an unknown stream, a leader
  // without a peer link).
  virtual std::optional<StreamLocation> locate_stream(std::string_view name) const {
    (void)name;
    return std::nullopt;
  }
  // Node `node` of this domain now holds `stream` durably through
  // `through` (its read of the stream acknowledged it): a follower's copy
  // grew (docs/cluster.md, "Replicated stream logs"). On a link thread.
  virtual void on_internal_ack(const std::string& stream, const std::string& node, uint64_t through) {
    (void)stream;
    (void)node;
    (void)through;
  }
  // Domain `domain` now holds `stream` durably through `through` (its
  // import acknowledged it): a hosted run's results reached the owner
  // (docs/cluster.md, "Moving a fragment to another domain"). On a link
  // thread; must not block.
  virtual void on_domain_ack(const std::string& stream, const std::string& domain, uint64_t through) {
    (void)stream;
    (void)domain;
    (void)through;
  }
  // Whether `domain` may read `stream` whole because of a hosted run: the
  // owner's stream a fragment it hosts reads, or, on the host, the
  // results of a run it hosts for `domain`. Asked before any stream
  // contract; no contract's terms or metering apply to such a read.
  // A call ("hosting.run", …) or notice ("hosting.usage") of a hosted run
  // from `peer` (federation/hosting.h): `message` the whole JSON object;
  // `answer` (null for a notice) answers it once, from any thread. On a
  // link thread: must not block.
  using HostingAnswer = std::function<void(bool ok, const std::string& reason, const std::string& body_json)>;
  virtual void on_hosting(const certs::Identity& peer, const std::string& type, const std::string& message,
                          HostingAnswer answer) {
    (void)peer;
    (void)type;
    (void)message;
    if (answer) answer(false, "this node runs no hosted fragments", "");
  }
  virtual bool may_read_hosted(const std::string& stream, const std::string& domain) {
    (void)stream;
    (void)domain;
    return false;
  }
};

}  // namespace entente::federation
