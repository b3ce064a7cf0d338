#pragma once
// Importer side of shared streams (docs/federation.md, "The importer
// imports", "Delivery"): one import per mirror stream, named DOMAIN/NAME.
// OPEN to the first node of the owner's domain whose link is up (or to the
// node a RESET moved named: docs/federation.md, "Imports from a domain of
// several nodes"); on
// OPEN_OK the mirror is created with the owner's schema; each DATA is
// appended to the mirror durably (HostStream::append_at) and only then
// acknowledged (ACK); credit goes back as soon as the write is queued.
//
// While every tuple arrives the mirror holds the owner's sequence numbers;
// once the owner filtered some out, the mirror numbers its rows itself and
// the owner's position (the next owner number expected) is kept in `meta`
// under "import-pos/DOMAIN/NAME", written atomically with each append.
// After a link drop or a restart it re-opens from that position (else the
// mirror's next sequence number) and drops anything it already has.
//
// Threading: frames and link events on the link io thread, tick() on the
// federation timer, the API on its threads, durability callbacks on the
// committer thread. One mutex guards the maps; each import has its own,
// taken before the maps' when both are held. Callbacks given to create()
// run with no lock held.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"
#include "certs/certs.h"
#include "engine/types.h"
#include "federation/config.h"
#include "federation/frame.h"
#include "federation/host.h"
#include "federation/messages.h"

namespace entente::contracts {
struct Contract;
}

namespace entente::federation {

class Traffic;
class Wire;
namespace detail {
class Deferred;
}

// An import as the API shows it.
struct ImportInfo {
  std::string stream;  // "beta/bids"
  std::string owner;   // identity URI of the node serving it, when known
  std::string node;    // a read of a node of this domain: that node; else empty
  std::string state;   // "connecting", "active", "refused"
  std::string reason;  // why refused, or the last problem
  engine::SchemaPtr schema;
  uint64_t next_seq = 0;
  uint64_t acked = 0;
  uint64_t tuples = 0;
};

class Imports final {
 public:
  struct Options {
    certs::Identity self;
    uint32_t window = 8u << 20;  // byte credit an OPEN grants
    // The configured peer domains now (a reload replaces them).
    std::function<std::shared_ptr<const std::vector<PeerDomainConfig>>()> peers;
  };
  Imports(Host& host, Wire& wire, Traffic& traffic, Options options);
  ~Imports();
  Imports(const Imports&) = delete;
  Imports& operator=(const Imports&) = delete;

  // The imports in the catalog (every mirror), to resume when their
  // owner's link comes up.
  Status load();

  // --- the API
  // Imports DOMAIN/NAME: answers once the owner accepted (the mirror
  // exists) or refused, or after `timeout`. `expected` (a query's declared
  // input schema) must match the owner's schema when given.
  using Done = std::function<void(Result<ImportInfo>)>;
  // `from_seq` > 0: the new mirror starts there rather than at the oldest
  // tuple the owner retains (a hosted run reads from its checkpoint's
  // positions on); the owner refuses a position it no longer holds.
  void create(const std::string& stream, engine::SchemaPtr expected, Done done,
              std::chrono::milliseconds timeout, uint64_t from_seq = 0);
  // Reads `stream`, a stream of this node's own domain that node `node`
  // leads, over the peer link to that node (docs/federation.md, "Reading a
  // stream of another node of the domain"): the mirror is "@NODE/STREAM"
  // (detail::internal_mirror_name) and gets every field and the owner's
  // sequence numbers; credit, ACK once durable, resume and the owner's
  // retention pin are those of an import. Answers as create() does.
  void create_internal(const std::string& stream, const std::string& node, engine::SchemaPtr expected, Done done,
                       std::chrono::milliseconds timeout);
  std::vector<ImportInfo> list() const;
  std::optional<ImportInfo> info(const std::string& stream) const;
  // Closes the channel and forgets the import; the caller deletes the mirror.
  Status forget(const std::string& stream);
  // A read of a node of this domain (create_internal) whose stream another
  // node leads now (a failover, docs/cluster.md): closes the channel to
  // the old node and opens at `node` from the mirror's next sequence
  // number; the mirror keeps its name. not_found when there is no such
  // read, invalid_argument for an import of another domain.
  Status redirect(const std::string& mirror, const std::string& node);

  // --- the links
  // OPEN_OK, DATA or RESET on an import's channel; false when no import
  // has that channel.
  bool on_frame(const certs::Identity& peer, FrameType type, uint32_t channel, std::string_view payload);
  void on_link_up(const certs::Identity& peer);
  void on_link_down(const certs::Identity& peer, std::string_view reason);
  // Refused imports that contract `c` (now in force) covers open again.
  void retry_refused(const contracts::Contract& c);
  // The federation timer: answers creations past their deadline and
  // re-opens imports due for a retry.
  void tick();

 private:
  struct Import;
  using ImportPtr = std::shared_ptr<Import>;
  using ChannelKey = std::pair<std::string, uint32_t>;  // peer URI, channel
  // The channel a frame arrived on, as the import had it then.
  struct Channel {
    uint64_t generation;
    certs::Identity owner;
    uint32_t id;
  };

  // A new import named `mirror` (of `stream` as the owner names it),
  // opened; `done` answers.
  void start(const std::string& mirror, std::string domain, std::string stream, std::string node,
             engine::SchemaPtr expected, Done done, std::chrono::milliseconds timeout, uint64_t from_seq = 0);
  void open(const ImportPtr& imp);
  // Frame handlers. REQUIRES: imp->mu held.
  void on_open_ok(const ImportPtr& imp, const Channel& ch, std::string_view payload, detail::Deferred& later);
  void on_reset(const ImportPtr& imp, const Channel& ch, std::string_view payload, detail::Deferred& later);
  // DATA, or DATA_NAMED (a read of a node of this domain only).
  void on_data(const ImportPtr& imp, const Channel& ch, FrameType type, std::string_view payload);
  // RESET moved: OPEN at the node it names (dialed if need be), at most
  // kMaxMoves times before an OPEN_OK; else the import is refused.
  void on_moved(const ImportPtr& imp, const Channel& ch, const std::string& reason, detail::Deferred& later);
  // DATA's rows once checked (numbered first..last, ascending, of the
  // mirror's schema); an error names what is wrong.
  Result<engine::Batch> checked_rows(const Import& imp, const Data& d) const;
  // Appends rows (the tuples of owner numbers first..last that passed, all
  // new), with the position and the named batches among them; ACK once
  // durable.
  Status store_rows(const ImportPtr& imp, const Channel& ch, engine::Batch rows, uint64_t first,
                    uint64_t last, bool whole, std::shared_ptr<const std::string> as_received,
                    std::vector<NamedBatch> named);
  // REQUIRES: imp->mu. Forgets the channel; what arrives on it is ignored.
  void drop_channel(Import& imp, const Channel& ch);
  // REQUIRES: imp->mu. RESET, then a new OPEN `after` from now.
  void reset_and_retry(Import& imp, const Channel& ch, WireError code, const std::string& reason,
                       std::chrono::milliseconds after);
  // REQUIRES: imp->mu. A refusal the import ends with: its callers get
  // `error`; an import whose mirror was never created is forgotten.
  void refuse(const ImportPtr& imp, const Error& error, detail::Deferred& later);
  void finish_pending(Import& imp, const Result<ImportInfo>& r, detail::Deferred& later);
  ImportInfo info_of(const Import& imp) const;
  ImportPtr find_by_channel(const ChannelKey& key) const;
  // The imports of streams owned by `domain`.
  std::vector<ImportPtr> imports_of(const std::string& domain) const;
  // True when a link to a configured node of `domain` other than `except` is up.
  bool other_node_up(const std::string& domain, const certs::Identity& except) const;
  const PeerDomainConfig* domain_config(const std::vector<PeerDomainConfig>& peers,
                                        const std::string& domain) const;

  Host& host_;
  Wire& wire_;
  Traffic& traffic_;
  const Options options_;

  mutable std::mutex mu_;
  std::map<std::string, ImportPtr> imports_;         // REQUIRES: mu_; by stream
  std::map<ChannelKey, ImportPtr> import_channels_;  // REQUIRES: mu_
};

}  // namespace entente::federation
