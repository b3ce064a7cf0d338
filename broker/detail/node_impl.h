#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// The node's internals, shared by node.cpp (lifecycle, catalog, recovery,
// maintenance), api.cpp (REST routes) and websocket.cpp (subscribe and
// publish sessions).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include "base/log.h"
#include "broker/config.h"
#include "broker/detail/query.h"
#include "broker/detail/streams.h"
#include "broker/detail/ui_live.h"
#include "broker/detail/ui_sessions.h"
#include "http/server.h"
#include "http/upstream.h"
#include "broker/metrics.h"
#include "certs/certs.h"
#include "engine/splits.h"
#include "store/group_commit.h"
#include "store/store.h"

namespace entente::cluster {
class Catalog;
class Etcd;
class Membership;
struct NodeLoad;
struct MembershipView;
}  // namespace entente::cluster

namespace entente::federation {
class Contracting;
class Hosting;
class Peering;
struct ImportInfo;
}  // namespace entente::federation

namespace entente::engine {
struct QueryCut;
}

namespace entente::broker::detail {

using federation::Contracting;
using federation::ImportInfo;
using federation::Peering;
class FederationHost;

class NodeImpl;

// The values of a route's {params}, percent-decoded, in path order.
using PathParams = std::vector<std::string>;
// A route's handler: the caller has checked the method and the role.
using RouteHandler = void (NodeImpl::*)(const http::Request& req, const PathParams& params,
                                        const http::Respond& answer);

// One route of the API. This one table (api_routes) drives the dispatch,
// the authorisation and the OpenAPI consistency test: method, path
// template ("/v1/streams/{name}", each {param} one segment), the role a
// token needs (none: public), whether it is a WebSocket upgrade (method
// "GET", served by NodeImpl::upgrade, handler null) and the handler.
struct RouteInfo {
  const char* method;
  const char* path;
  std::optional<Role> role;
  bool websocket;
  RouteHandler handler;
};
const std::vector<RouteInfo>& api_routes();

// The routes whose template matches `path` (the path as sent, still
// percent-encoded), in table order: all with the same template, or none.
// `params` receives the decoded {param} segments.
std::vector<const RouteInfo*> match_routes(std::string_view path, PathParams& params);

// A query body's "placement" (docs/cluster.md), and the body without it,
// which is the query network the engine reads.
// A follower of a stream, as its leader sees it (replica_states).
struct ReplicaState {
  std::string node;
  uint64_t acked = 0;       // the last sequence number it holds durably
  uint64_t lag_tuples = 0;  // the leader's head minus acked
  bool connected = false;   // its channel is open
  bool opened = false;      // it has opened its copy here at least once
  bool in_sync = false;     // in the stream's in-sync set (the catalog's)
};

// The catalog entry of a query cut into fragments across nodes
// (cluster_fragments.cpp).
struct CutEntry {
  std::vector<std::pair<std::string, std::string>> fragments;  // name, node; in pipeline order
  std::vector<std::string> outputs;
  std::string state;  // "deploying", "running"
  // Stopped by its administrator (POST /v1/queries/{name}/stop): every
  // node running one of its fragments keeps it stopped, a node taking one
  // over too (cluster_lifecycle.cpp).
  bool stopped = false;
  // The node replacing its network now ("" when none; cluster_replace.cpp).
  std::string replacing;
  std::string json;   // the entry
  int64_t revision = 0;
};

// The one fragment of a whole query deployed in a domain of several nodes
// (docs/cluster.md, "Whole queries fail over too"): the query runs as a
// cut of this single fragment, "QUERY--all", so that its journal and
// checkpoints live in a replicated state stream and it fails over as any
// fragment does. It is the only fragment of that cut, so no user's box id or
// fragment name can clash with it.
inline constexpr const char* kWholeQueryFragment = "all";

struct QueryPlacement {
  std::string node;  // empty: the controller decides
  std::string fragments_json;  // "placement.fragments" as given; empty: none
  std::string network_json;
};

// A query body's lifecycle fields (docs/query-networks.md, "Queries over
// their lifetime"), read and removed before the engine validates the
// network: where its inputs start, and (PUT) which boxes drop their state.
struct StartPoint {
  enum class Kind : uint8_t { latest, earliest, seq };
  Kind kind = Kind::latest;
  uint64_t seq = 0;  // Kind::seq
};
struct QueryOptions {
  bool start_given = false;                   // "start_from" was in the body
  StartPoint start_all;                       // "start_from": "earliest" | "latest"
  std::map<std::string, StartPoint> start_by;  // "start_from": {INPUT or STREAM: ...}
  std::set<std::string> drop_state;           // PUT: box ids
  std::string network_json;                   // the body without them
};
// What a replacement of a query's network keeps (replace_query).
struct QueryReplacement {
  QueryMeta meta;
  std::vector<StreamPtr> ins, outs;                // outs: null for an output to create
  std::vector<std::optional<size_t>> input_from;   // per new input: the old input it continues
  std::vector<std::optional<size_t>> output_from;  // per new output: the old output it continues
  std::vector<StreamMeta> created;                 // the new outputs' streams, in order
  std::vector<std::string> dropped;                // old outputs it no longer writes
  std::vector<std::pair<std::string, std::string>> kept_boxes;  // whose state carries over
};
// A replacement of the network of a query of several nodes, planned
// (cluster_replace.cpp): the fragment's next generation, its network
// under the runner's name, the old and new networks and what carries over.
struct ClusterReplacePlan {
  std::string generation, new_runner, new_network;
  std::optional<engine::QueryNetwork> from, to;
  QueryReplacement r;
};
// The boxes of `from` whose state carries over to `to` (r.kept_boxes);
// conflict naming every box whose state cannot and that
// options.drop_state does not name (a drop_state naming no box of `to`:
// in `diag`).
// The refusal of `e`: a 400 with every problem of `diag` (in `errors`)
// when it has some, else problem_for(e).
http::Response problem_with(const Error& e, const Diagnostics& diag);
Status plan_kept_boxes(const engine::QueryNetwork& from, const engine::QueryNetwork& to,
                       const QueryOptions& options, QueryReplacement& r, Diagnostics& diag);
// Reads and removes "start_from" and "drop_state" (`allow_drop`: a PUT);
// invalid_argument with the JSON path when malformed. A body that is not
// a JSON object is passed on as it is (the engine reports it).
Result<QueryOptions> read_query_options(std::string_view body, bool allow_drop);
// Why a declared input schema is not its stream's: "whose schema is ...",
// the first field that differs, the declared schema.
std::string schema_difference(const engine::Schema& declared, const engine::Schema& stream);

struct StreamEntry;

class NodeImpl final : public http::Handler {
 public:
  explicit NodeImpl(NodeConfig config);
  ~NodeImpl() override;

  Status open();
  Status start();
  void stop();
  // A configuration reload (SIGHUP, docs/operations.md): applies the API
  // tokens, the API's certificate and key, and the federation's pinned
  // CAs, certificate, key and peers from `next` (parsed and validated);
  // `changes` gets one line per change, `kept` each setting that differs
  // but needs a restart. An error (a file that cannot be used) changes
  // nothing. Called from one thread at a time (the signal thread).
  Status reload(NodeConfig next, std::vector<std::string>& changes, std::vector<std::string>& kept);
  uint16_t port() const { return server_ ? server_->port() : 0; }

  // http::Handler (api.cpp, websocket.cpp)
  void handle(http::Request&& req, http::Respond respond) override;
  std::shared_ptr<http::WebSocketSession> upgrade(const http::Request& req,
                                                  http::Response& reject) override;
  // The WebSocket subprotocol an accepted upgrade answers with (ui.cpp).
  std::string subprotocol(const http::Request& req) const override;

  // --- used by the API
  struct AuthResult {
    bool ok = false;
    Role role = Role::reader;
    std::string name;
    http::Response problem;  // when !ok
  };
  AuthResult authenticate(const http::Request& req, Role needed) const;

  Result<StreamPtr> create_stream(StreamMeta meta);
  // `moved_to`: the node leading it now, when this node drops its log for
  // that (its subscribers are told where to resume, close code 4010).
  Status delete_stream(const std::string& name, const std::string& moved_to = {});
  // Stops importing another domain's stream and deletes its mirror
  // (conflict while a query reads it).
  Status delete_import(const std::string& name);
  StreamPtr find_stream(const std::string& name) const;
  // The schema of a stream of the domain: this node's, or the catalog's
  // for one another node leads; null when there is none.
  engine::SchemaPtr domain_stream_schema(const std::string& name) const;

  std::vector<StreamPtr> list_streams() const;
  // --- acknowledging what the followers hold (cluster_replication.cpp)
  // Calls `release` once every follower in `stream`'s in-sync set (in the
  // catalog) holds `last` durably. A member whose channel closes, or that
  // has not acknowledged within kReplicaWaitMs, is taken out of the set in
  // etcd first; when etcd cannot be told, `release` gets unavailable after
  // kReplicaGiveUpMs. At once when the set is empty (or no cluster).
  void when_replicated(const std::string& stream, uint64_t last, std::function<void(const Status&)> release);
  // A follower acknowledged more of `stream` (the federation layer): the
  // appends waiting for it, and the stream's visible head, move.
  void on_replica_ack(const std::string& stream);
  // --- what readers see (cluster_replication.cpp, docs/cluster.md)
  // Bounds `s`'s visible head to what every follower in its in-sync set
  // holds (no bound when none is in sync, or the stream has no followers).
  // Leaves it as it is while the catalog was never read or another node
  // leads the stream. `from_log`: records hidden since before a restart
  // may be read from the store (not on the link or committer threads).
  void refresh_visible(const StreamPtr& s, bool from_log);
  // Before `stream`'s in-sync set becomes `in_sync` in etcd (a follower
  // joins): its visible head waits for those members from now on.
  void bound_visible_to(const std::string& stream, const std::vector<std::string>& in_sync);
  // True when `node` is one of the followers of `stream`, a stream this
  // node leads: its read of the stream follows the durable head.
  bool is_follower(const std::string& stream, const std::string& node) const;
  // {"factor", "replicas": [{"node", "acked", "lag_tuples", "connected",
  // "in_sync"}]} for a stream this node leads in a cluster (docs/cluster.md,
  // "Replicated stream logs"); nullopt else.
  std::optional<std::string> replication_json(const std::string& stream) const;
  // The same as values: each follower of a stream this node leads.
  std::optional<std::vector<ReplicaState>> replica_states(const std::string& stream) const;

  // Deploys a query network; all validation problems in `diag`. With
  // `fragment`, the network is a fragment of a query cut across nodes
  // (engine::cut_query): its internal inputs read the local streams
  // `fragment->reads` names, from their first tuple, and its internal
  // outputs are created as internal streams (engine::internal_stream_schema).
  struct FragmentOf {
    std::string query;
    std::string fragment;
    std::map<std::string, std::string> reads;  // internal stream -> local stream holding it
    std::set<std::string> writes;              // internal streams written
    // Taking the fragment over from a node that died: its outputs and its
    // state stream are already here (copies this node held, made its
    // own by the failover, producer "query:QUERY"); they are used as they
    // are, and the runner recovers from the state stream before it starts.
    bool takeover = false;
    // Taken over while its query is stopped (CutEntry::stopped): it
    // recovers and stays stopped.
    bool stopped = false;
    // The new network of a query being replaced: deployed from `seed`,
    // checkpointed and left stopped (FragmentRun::replacement).
    bool held = false;
    // A warm standby for a move to this node (cluster_standby.cpp): the
    // runner is built over this node's follower copies (stream -> copy),
    // neither registered nor started, and returned warming.
    bool standby = false;
    std::map<std::string, std::string> copies;
    // Taking over: the standby warmed for it, promoted instead of a new
    // runner recovering when it continues the same logs.
    std::shared_ptr<QueryRunner> warm;
    // Made by a split (cluster_splits.cpp): the runner starts from this
    // state instead of its inputs' first tuples and a fresh executor, and
    // the outputs `adopt` names (the split fragment's, producer
    // "query:QUERY") are used as they are, continuing their sequence
    // numbers. Null otherwise.
    struct Seed {
      QueryRunner::State state;
      std::set<std::string> adopt;
    };
    std::shared_ptr<const Seed> seed;
  };
  // `options`: where a new query's inputs start (latest by default);
  // conflict when a sequence number given is outside a stream's log.
  Result<std::shared_ptr<QueryRunner>> deploy_query(std::string_view network_json, Diagnostics& diag,
                                                    const FragmentOf* fragment = nullptr,
                                                    const QueryOptions* options = nullptr);
  // --- a query over its lifetime (query_lifecycle.cpp)
  // Inputs declared without "schema" take their stream's (as far as this
  // node knows the stream); the document otherwise unchanged.
  std::string fill_input_schemas(std::string_view network_json) const;
  // Where input `in` starts reading `stream` per `options`; `conflict`
  // says why when the sequence number given is outside the stream's log.
  // REQUIRES: catalog_mu_ held.
  uint64_t start_position(const engine::NetworkInput& in, const Stream& stream, const QueryOptions* options,
                          std::string& conflict) const;
  // Names in "start_from" that are no input of `net`, nor a stream one reads.
  void check_start_names(const engine::QueryNetwork& net, const QueryOptions* options, Diagnostics& diag) const;
  // POST /v1/queries/{name}/stop and /start, PUT /v1/queries/{name}.
  void stop_query_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void start_query_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void replace_query_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  // A whole query of this node (not a fragment), or the answer why not
  // (404, 501).
  std::shared_ptr<QueryRunner> lifecycle_target(const std::string& name, const char* what,
                                                const http::Respond& answer);
  // --- stopping and starting a query of a domain of several nodes
  // (cluster_lifecycle.cpp)
  // Stop (`stop`) or start the query `name` when it is a cut query of the
  // domain (whole queries of several-node domains are cuts of one
  // fragment) or runs on another node: true once it answered (or
  // forwarded); false for a query of this node, handled here.
  bool cluster_lifecycle(const http::Request& req, const std::string& name, bool stop,
                         const http::Respond& answer);
  // POST /v1/queries/{name}/fragments/{fragment}/stop and /start.
  void stop_fragment_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void start_fragment_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void fragment_lifecycle(const std::string& query, const std::string& fragment, bool stop,
                          const http::Respond& answer);
  // Sets or clears "stopped" in the query's entry (compare-and-set on a
  // fresh read); the entry as written, or why not.
  Result<CutEntry> set_cut_stopped(const std::string& query, bool stopped);
  // A fragment of a stopped query running here, or of a started one
  // stopped here (a stop or start that did not reach this node): made to
  // agree with the entry (run_placed_fragments' tick).
  void agree_with_entry(const std::string& query, const std::string& runner, bool stopped);
  // The answer refusing `what` on a query that is stopped (with
  // `stopped_too`) or whose network is being replaced; nullopt otherwise.
  std::optional<http::Response> refuse_if_held(const CutEntry& entry, const std::string& what,
                                               bool stopped_too = true) const;
  // Why a fragment of the entry keeps the query from stopping, starting or
  // being replaced now: hosted in another domain, or moving ("" if none).
  static std::string busy_fragment_of(const std::string& entry_json);
  // --- replacing the network of a query of several nodes
  // (cluster_replace.cpp)
  // PUT /v1/queries/{name} of a query the entry says runs as fragments:
  // forwarded to the node running its one fragment, which replaces it.
  void cluster_replace(const http::Request& req, const CutEntry& entry, QueryOptions options,
                       const http::Respond& answer);
  // The replacement itself, on the lifecycle thread: nullopt once done,
  // else the refusal (nothing changed) or the failure (the old network
  // runs again).
  std::optional<http::Response> run_cluster_replace(const std::string& query, const std::string& fragment,
                                                    const QueryOptions& options);
  // entente_query_replacements_total{query, outcome}: "replaced",
  // "refused" (a 4xx: nothing changed) or "failed" (the old network goes on).
  void count_replacement(const std::string& query, int status);
  // Its plan, or the refusal (nothing changed).
  std::variant<ClusterReplacePlan, http::Response> plan_cluster_replace(const std::string& query,
                                                                        const std::string& fragment,
                                                                        const QueryRunner& old,
                                                                        const QueryOptions& options);
  // The entry names the new generation (`body`, its boxes and the query's
  // outputs) and loses its "replacing" mark; `stopped` says whether the
  // query is. False when it could not be written.
  bool name_generation(const std::string& query, const ClusterReplacePlan& plan, const std::string& body,
                       bool& stopped);
  // Whether the entry's "replacing" mark is a replacement under way: on
  // this node, one it runs; else the marking node is up.
  bool replacement_live(const CutEntry& entry) const;
  // The query whose replacement left stream `name`: a stream it made that
  // no run of it writes, the new network's, left when the replacing node
  // died before the query's entry named it. DELETE /v1/streams/{name}
  // drops it. nullopt for any other stream.
  std::optional<std::string> replacement_leftover(const std::string& name) const;
  // Removes such a network's held run found on restart, with its streams
  // that no other node leads (drop_superseded_fragments).
  void drop_replacement_leftover(const QueryMeta& meta, const CutEntry& entry);
  // Drops the streams `names` that query `query` wrote (here and from the
  // domain's catalog).
  void drop_streams_of_query(const std::string& query, const std::vector<std::string>& names);
  // Stops and starts of fragments run on a thread of their own: each waits
  // for a checkpoint that the state stream's followers hold, which neither
  // the network thread nor the membership tick may wait for. False once
  // the node is stopping (the job does not run).
  bool post_lifecycle(std::function<void()> job);
  void stop_lifecycle();
  mutable std::mutex lifecycle_jobs_mu_;
  std::condition_variable lifecycle_cv_;
  std::deque<std::function<void()>> lifecycle_jobs_;  // REQUIRES: lifecycle_jobs_mu_
  std::set<std::string> lifecycle_pending_;           // REQUIRES: lifecycle_jobs_mu_; agree_with_entry's runners
  std::set<std::string> replacing_;                   // REQUIRES: lifecycle_jobs_mu_; queries replaced here now
  bool lifecycle_stopping_ = false;                   // REQUIRES: lifecycle_jobs_mu_
  std::thread lifecycle_thread_;
  Result<std::shared_ptr<QueryRunner>> stop_query(const std::string& name);
  Result<std::shared_ptr<QueryRunner>> start_query(const std::string& name);
  Result<std::shared_ptr<QueryRunner>> replace_query(const std::string& name, const QueryOptions& options,
                                                     Diagnostics& diag);
  // A new runner for `meta` (a whole query here, or a fragment with its
  // state stream) recovered from its checkpoint and journal, not started. REQUIRES: catalog_mu_ held.
  Result<std::shared_ptr<QueryRunner>> recovered_runner(const QueryMeta& meta);
  // Writes `meta` as the query's catalog record (synced).
  Status put_query_meta(const QueryMeta& meta);
  // One stop, start or replace at a time on this node.
  std::mutex lifecycle_mu_;
  // Steps of replace_query. REQUIRES: catalog_mu_ held (unique).
  void plan_inputs(const engine::QueryNetwork& net, const QueryMeta& old, const QueryOptions& options,
                   QueryReplacement& r, Diagnostics& diag, std::string& conflict) const;
  void plan_outputs(const engine::QueryNetwork& net, const QueryMeta& old, QueryReplacement& r, Diagnostics& diag,
                    std::string& conflict) const;
  // Stops `old`, carries its state into the new runner and writes it all
  // in one write; on failure `old` runs again (from its checkpoint).
  Result<std::shared_ptr<QueryRunner>> swap_runner(const std::shared_ptr<QueryRunner>& old,
                                                   const engine::QueryNetwork& from, const engine::QueryNetwork& to,
                                                   QueryReplacement r);
  StreamPtr new_output_stream(StreamMeta sm);
  Status delete_query(const std::string& name);
  // deploy_query taking a fragment over (REQUIRES: catalog_mu_): its warm
  // standby promoted over these streams, or else `fresh` recovered from
  // the state stream.
  Result<std::shared_ptr<QueryRunner>> take_over_runner(const FragmentOf& fragment, std::shared_ptr<QueryRunner> fresh,
                                                        const std::vector<StreamPtr>& ins,
                                                        const std::vector<StreamPtr>& outs, StreamPtr state);
  std::shared_ptr<QueryRunner> find_query(const std::string& name) const;
  std::vector<std::shared_ptr<QueryRunner>> list_queries() const;
  // The queries, and the fragments this node hosts for other domains
  // (cluster_hosted.cpp): what the maintenance thread checkpoints and
  // whose state streams it trims.
  std::vector<std::shared_ptr<QueryRunner>> checkpointed_runners();
  // Queries reading `stream` (for backpressure and delete checks).
  std::vector<std::shared_ptr<QueryRunner>> readers_of(const std::string& stream) const;

  // Checkpoints every query now; `done` gets them all (on some thread).
  void checkpoint_all(std::function<void(std::vector<Result<CheckpointInfo>>)> done);

  // Backs the node up into the new directory `dir` (absolute; its parent
  // exists): a consistent copy of the whole store (a RocksDB checkpoint)
  // in `dir`/store and a description in `dir`/backup.json, so that `dir`
  // serves as a data_dir. Everything acknowledged before the call is in
  // it. Runs on the maintenance thread, one backup at a time; `done` gets
  // the result there. Errors: invalid_argument, already_exists, not_found
  // (no parent), unavailable (a backup is running, or the node stops),
  // io_error.
  struct BackupResult {
    std::string dir;
    store::BackupInfo store;
    int64_t created_ms = 0;
  };
  void backup(std::string dir, std::function<void(Result<BackupResult>)> done);

  // Ingest: parses, appends, and answers through `respond`. Also used by
  // the WebSocket publisher with `on_done` instead of an HTTP response.
  struct IngestOk {
    uint64_t count = 0, first = 0, last = 0;
  };
  using IngestDone = std::function<void(Result<IngestOk>, unsigned status, std::string problem_json_members)>;


  const NodeConfig& config() const { return config_; }
  Registry& metrics() { return metrics_; }
  store::Store& store() { return *store_; }
  store::GroupCommit& gc() { return *gc_; }
  int64_t started_ms() const { return started_ms_; }

 private:
  friend const std::vector<RouteInfo>& api_routes();
  // locate_stream reads the catalog and the membership view.
  friend class FederationHost;

  // Route handlers (api.cpp), one per route of api_routes().
  void get_health(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void get_openapi(const http::Request& req, const PathParams& params, const http::Respond& answer);
  // The dashboard (ui.cpp, docs/dashboard.md).
  void get_ui(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void post_ui_session(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void delete_ui_session(const http::Request& req, const PathParams& params, const http::Respond& answer);
  // A browser's credentials as the bearer token they stand for (ui.cpp): a
  // live session cookie on a GET that needs no more than a reader, or
  // "entente.bearer.<token>" among a WebSocket upgrade's subprotocols. Adds
  // the Authorization header when the request has none; a problem when the
  // subprotocols are malformed.
  std::optional<http::Response> browser_bearer(http::Request& req, const RouteInfo& route) const;
  // The WebSocket upgrade once the route is known (websocket.cpp).
  std::shared_ptr<http::WebSocketSession> upgrade_authorised(const http::Request& req, const RouteInfo& route,
                                                             const std::string& param, bool subscribe,
                                                             http::Response& reject);
  void get_metrics(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void list_streams_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void create_stream_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void get_stream(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void delete_stream_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void post_tuples(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void list_queries_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void deploy_query_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void get_query(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void delete_query_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  // The network of a deploy or replace body: lifecycle fields read, input
  // schemas filled in; nullopt once it answered (400, 501).
  std::optional<QueryOptions> query_body(const http::Request& req, bool allow_drop, const http::Respond& answer);
  void list_checkpoints(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void take_checkpoints(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void post_backup(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void get_peers(const http::Request& req, const PathParams& params, const http::Respond& answer);
  // GET /v1/nodes (cluster_node.cpp, docs/cluster.md).
  void get_nodes(const http::Request& req, const PathParams& params, const http::Respond& answer);
  // DELETE /v1/nodes/{node}: forgets a node that is gone for good.
  void delete_node(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void list_imports(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void create_import_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void get_import(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void delete_import_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  // The /v1/contracts routes (api_contracts.cpp, docs/contracts.md).
  void list_contracts(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void get_contract(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void get_contract_usage(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void propose_contract(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void counter_contract(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void accept_contract(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void reject_contract(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void revoke_contract(const http::Request& req, const PathParams& params, const http::Respond& answer);
  // What the contract routes share: the federation's Contracting, or null
  // once the request has been answered (415, 404).
  Contracting* contracting_for(const http::Request& req, const http::Respond& answer);
  void contract_action(const std::string& route, const http::Request& req, const std::string& id,
                       const http::Respond& answer);
  // False once it has answered 415 (the body is not application/json).
  bool json_body(const http::Request& req, const http::Respond& answer) const;

  // With a cluster section: connects to etcd and starts the membership
  // thread (cluster_node.cpp). After the API and peer listeners are bound.
  Status start_cluster();
  // What this node reports to the others at every membership tick.
  cluster::NodeLoad node_load();
  // A short hash of this node's tokens (roles and hashes, sorted).
  std::string tokens_fingerprint() const;
  // --- the domain's streams (cluster_streams.cpp, docs/cluster.md)
  // The node the domain's catalog says leads `stream`; nullopt when the
  // stream is not in the catalog (or there is no cluster).
  std::optional<std::string> stream_leader(const std::string& stream) const;
  // When the request is about a stream another node leads, forwards it
  // there and returns true (the answer comes from there).
  bool forward_if_elsewhere(const http::Request& req, const RouteInfo& route, const PathParams& params,
                            const http::Respond& answer);
  // POST /v1/streams in a cluster: placement, the catalog entry, then the
  // local stream.
  void cluster_create_stream(const http::Request& req, const http::Respond& answer);
  // The followers of a new stream with `replication` copies (0: the
  // default); the answer to give instead when they cannot be had.
  std::optional<http::Response> choose_followers(int replication, const cluster::MembershipView& view,
                                                 std::vector<std::string>& followers) const;
  void cluster_list_streams(const http::Request& req, const http::Respond& answer);
  Status cluster_delete_stream(const std::string& name);
  // The catalog entry of each local stream that lacks one (created before
  // the cluster section, or a query's output), and the local stream of each
  // entry this node leads that it lacks (a crash between the two writes).
  void reconcile_streams();
  // Sends the request to `node` (with `body` instead of the request's when
  // given) and answers with what it answers; `timeout_ms` bounds the wait
  // for the answer when positive (else the upstream's 30 s).
  void forward(const http::Request& req, const std::string& node, const http::Respond& answer,
               std::optional<std::string> body = std::nullopt, int64_t timeout_ms = 0);
  std::shared_ptr<http::WebSocketSession> forward_websocket(const http::Request& req, const std::string& node,
                                                            http::Response& reject);
  // --- the domain's queries (cluster_queries.cpp)
  // Reads and checks a deploy's "placement"; in a cluster, places the
  // query (cluster_place_query). nullopt once it answered or forwarded.
  std::optional<QueryPlacement> place_query(const http::Request& req, const std::string& body,
                                            const http::Respond& answer);
  // Decides where a query runs; true when here (its catalog entry is
  // then written), false when it answered or forwarded the request.
  bool cluster_place_query(const http::Request& req, const QueryPlacement& placement,
                           const engine::QueryNetwork& net, const http::Respond& answer);
  // After a local deploy placed by cluster_place_query: the catalog entry
  // completed (or removed when the deploy failed) and the outputs listed.
  void cluster_query_deployed(const std::string& name, const Result<std::shared_ptr<QueryRunner>>& q);
  bool forward_query_if_elsewhere(const http::Request& req, const std::string& name, const http::Respond& answer);
  // The queries of other nodes, as {"name", "node"} objects.
  void cluster_list_queries(std::vector<std::string>& extra_json) const;
  Status cluster_delete_query(const std::string& name);
  // --- queries cut into fragments across nodes (cluster_fragments.cpp)
  // The catalog entry of `query` when it is a cut query.
  // With `fresh`, read from etcd itself when it answers (this node's copy
  // may not show yet a deploy or a delete that another node just answered),
  // else from the copy.
  std::optional<CutEntry> cut_entry(const std::string& query, bool fresh = false) const;
  static std::string query_of_entry(const CutEntry& entry);
  // The deploy's "start_from" as JSON text ("" without one), its names
  // checked against the whole query; invalid_argument naming the first
  // that is no input of it.
  Result<std::string> cut_start_from(const http::Request& req, const engine::QueryNetwork& net) const;
  // Deploys a query whose placement puts fragments on several nodes.
  void cluster_deploy_cut(const http::Request& req, const QueryPlacement& placement,
                          const engine::QueryNetwork& net, const http::Respond& answer);
  // Deletes the first `deployed` fragments in pipeline order, last first.
  void undo_cut(const http::Request& req, const std::string& query, const engine::QueryCut& cut, size_t deployed,
                std::function<void()> done);
  void get_cut_query(const http::Request& req, const CutEntry& entry, const http::Respond& answer);
  void delete_cut_query(const http::Request& req, const CutEntry& entry, const http::Respond& answer);
  // Runs fragment `fragment` of `query` on this node from its PUT body
  // (network, reads, writes): reads the internal streams other nodes lead
  // over the peer links, then deploys it (FragmentOf). Taken over, its
  // streams are here already and it recovers from them (or a warm standby
  // continues); as a standby, it is built over this node's copies of them
  // and warms. As the new network of a query being replaced
  // (`replacement`, cluster_replace.cpp), it is deployed as a fresh one
  // from `seed` (its streams created, its outputs in seed->adopt taken
  // on), checkpointed into its state stream and left stopped, not started.
  // `done` gets the runner or why not.
  enum class FragmentRun { fresh, takeover, standby, replacement };
  void run_fragment(const std::string& query, const std::string& fragment, const std::string& body,
                    FragmentRun how,
                    std::function<void(Result<std::shared_ptr<QueryRunner>>, bool bad_request)> done,
                    std::shared_ptr<const FragmentOf::Seed> seed = nullptr);
  // The followers a new fragment's streams get: those of the stream it
  // reads, so that the node taking the input over can run it; else the
  // least loaded nodes. Empty in a domain of one node.
  std::vector<std::string> fragment_followers(const QueryMeta& meta) const;
  // Records a new fragment's outputs and state stream in the catalog, led
  // here and copied by fragment_followers(meta).
  void replicate_fragment_streams(const QueryMeta& meta);
  // --- failover of fragments (cluster_takeover.cpp)
  // Runs here the fragments of nodes that are down whose state stream
  // this node now leads (their outputs too): same deterministic replay as
  // a restart, from the replicated checkpoint and journal.
  void take_over_fragments(const cluster::MembershipView& view);
  // The streams of one fragment that fail over together, to one node
  // (cluster_failover.cpp): those it writes, its outputs then its state
  // stream (last); and the query input it reads, if any, where the group
  // belongs.
  struct FragmentGroup {
    std::vector<std::string> writes;
    std::string input;
  };
  // Each stream a fragment writes -> its fragment's group.
  std::map<std::string, FragmentGroup> fragment_stream_groups() const;
  // The controller: moves a fragment's streams led apart back together,
  // to the leader of its input (else of its state stream), once that node
  // is in their in-sync sets.
  void join_split_groups(const std::map<std::string, FragmentGroup>& groups,
                         const std::map<std::string, StreamEntry>& by_name, const std::set<std::string>& up);
  // A fragment reading an internal stream from a node that no longer
  // leads it reads it from the new leader (Imports::redirect), or, when
  // this node leads it now, is restarted reading it locally.
  void follow_moved_reads();
  // A fragment running here that the catalog places on another node (it
  // was taken over while this node was away) is stopped and removed; its
  // streams are copied afresh from the new leader as a follower's.
  void drop_superseded_fragments();
  // This node's logs of fragment `meta`'s streams that another node leads
  // now, and its reads of other nodes' streams for it, go (the fragment
  // stopped here); local readers of those logs run again on the stream.
  void release_fragment_streams(const QueryMeta& meta);
  // --- moving a fragment to another node (cluster_moves.cpp)
  // POST /v1/queries/{name}/fragments/{fragment}/move.
  void move_fragment_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  // The move route when its target is a node of another domain (hosting
  // under a contract, cluster_hosting.cpp): answers and returns true;
  // false when the body names a node of this domain.
  bool host_fragment_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  struct FragmentMove {
    std::string query;
    std::string fragment;
    std::string to;
    http::Request get;  // GET of the fragment, with the caller's credentials
    http::Respond answer;
  };
  void move_loop();
  // The move, on the move thread: the answer to give. Its steps:
  http::Response run_move(const FragmentMove& m);
  // `to` follows each of `streams` led here (those it did not are added to
  // `added`) and is in their in-sync sets.
  Status move_follow(const std::vector<std::string>& streams, const std::string& to, std::vector<std::string>& added);
  void undo_move_follow(const std::vector<std::string>& added, const std::string& to);
  Status move_checkpoint(QueryRunner& q);
  // Every record written here to `streams` is held by `to`, in sync.
  Status move_replicate(const std::vector<std::string>& streams, const std::string& to);
  // Every stream's entry names `to` (epoch + 1), in one transaction; an
  // error when they could not pass (none did).
  Status move_hand_over(const std::vector<std::string>& streams, const std::string& to, const std::string& what);
  // The target runs the fragment (within the wait's bounds); `warm`: from
  // the standby it warmed (asked of the standby, else of the fragment).
  bool move_await_target(const FragmentMove& m, bool warm);
  bool in_sync_everywhere(const std::vector<std::string>& streams, const std::string& node) const;
  void stop_moves();
  // Polls `done` until it holds, `bound` passes or the node stops.
  bool move_wait(std::chrono::steady_clock::duration bound, const std::function<bool()>& done);
  // Compare-and-set of stream `stream`'s entry through `edit` (false: no
  // change wanted); true when written.
  Result<bool> edit_stream_entry(const std::string& stream, const std::function<bool(StreamEntry&)>& edit);
  // Marks (or, with `to` empty, unmarks) fragment `fragment` as moving to
  // `to` in its query's entry, so the taking over names the request.
  bool mark_fragment_moving(const std::string& query, const std::string& fragment, const std::string& to);
  // Adds `pause_ms` to the fragment's last move in its query's entry, the
  // one to `to` (written by the target's take-over).
  void record_move_pause(const std::string& query, const std::string& fragment, const std::string& to,
                         double pause_ms);
  std::mutex move_mu_;
  std::condition_variable move_cv_;
  std::deque<FragmentMove> move_queue_;  // REQUIRES: move_mu_
  std::set<std::string> moving_;         // REQUIRES: move_mu_; QUERY/FRAGMENT
  bool move_stopping_ = false;           // REQUIRES: move_mu_
  std::thread move_thread_;
  // Asks `to` for a warm standby of the fragment and waits until it has
  // replayed the journal to within a few entries of `q`'s (else an error:
  // the move goes on without it, the target recovering after the pause;
  // io_error when the target does not answer at all: the move gives up).
  Status move_warm(const FragmentMove& m, const QueryRunner& q);
  // Sends `method` on the fragment's standby path to `to` with the move's
  // credentials; the answer (a 504 problem when none came in time).
  http::Response standby_request(const FragmentMove& m, const std::string& method);
  // --- warm standbys of fragments moving here (cluster_standby.cpp)
  // POST|GET|DELETE /v1/queries/{name}/fragments/{fragment}/standby.
  void standby_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  // The standby's state (`code` when there is one, else 404).
  http::Response standby_status(const std::string& query, const std::string& fragment, int code);
  // Starts building a standby of the fragment here; the refusal if it
  // cannot be (not placed in the catalog, runs here, no body).
  std::optional<http::Response> build_standby(const std::string& query, const std::string& fragment);
  struct Standby {
    std::shared_ptr<QueryRunner> runner;  // null while it is being built
    uint64_t journal_next = 0;            // replayed up to (warm() result)
    std::string error;                    // the last warm() error
    std::chrono::steady_clock::time_point touched;
    // Promoted by the take-over and running: kept (without its runner)
    // so that the move sees it at once, without asking the runner itself.
    bool promoted = false;
    bool taken = false;  // by a take-over, which has not said how it went
  };
  // The standby of runner `name`, taken out of the standbys (null if none);
  // the take-over then says how it went (standby_taken).
  std::shared_ptr<QueryRunner> take_standby(const std::string& name);
  // `promoted`: the take-over continued from it and the fragment runs;
  // else it recovered another way, and the standby is forgotten.
  void standby_taken(const std::string& name, bool promoted);
  void standby_loop();
  void stop_standbys();
  // Stops a standby that will not be promoted, and closes the reads of
  // other nodes it opened that nothing else here reads.
  void drop_standby(const std::shared_ptr<QueryRunner>& runner);
  std::mutex standby_mu_;
  std::condition_variable standby_cv_;
  std::map<std::string, Standby> standbys_;  // REQUIRES: standby_mu_; by runner name
  bool standby_stopping_ = false;            // REQUIRES: standby_mu_
  std::thread standby_thread_;
  // --- hosted runs: a fragment run by a node of another domain under a
  // hosting contract (cluster_hosted.cpp; docs/cluster.md, "Moving a
  // fragment to another domain").
  // Owner side. A fragment of this node's that a host runs: its results
  // come back as imports of the host's hidden streams, which the relay
  // appends to the fragment's own outputs and state stream here, at the
  // same sequence numbers.
  struct HostedRun {
    std::string query, fragment, runner;
    std::string host_domain, host_node, contract;
    std::string body;  // the fragment's body (network, reads, writes)
    QueryMeta meta;    // its runner's meta when it stopped here
    std::vector<std::pair<std::string, std::string>> relays;  // mirror of a hidden stream -> stream here
    std::vector<std::string> grants;                         // streams of this domain the host reads
    int64_t since_ms = 0;
    double pause_ms = 0;
    double cpu_seconds = 0;  // the host's figure (hosting.usage)
    double cpu_ms_per_s = 0;  // the host's figure: CPU ms per second lately
    int over_load = 0;        // checks in a row with the contract's max_load exceeded
    double cost = 0;         // cpu_seconds at the contract's price
    uint64_t price = 0;      // credits per CPU-second (the contract's price_min)
    uint64_t load = 0;       // CPU ms per second, as admitted
    std::chrono::steady_clock::time_point link_down_since{};  // zero while the link is up
    bool ending = false;
  };
  // Host side. A fragment this node runs for another domain, unseen by
  // this node's API: its runner is no query here, and the streams it
  // writes, and the copies of the owner's streams it reads, are no
  // streams here (hosted_streams_).
  struct HostedHere {
    std::string owner_domain, owner_node, contract, query, fragment;
    std::shared_ptr<QueryRunner> runner;
    std::vector<std::string> streams;  // hidden: outputs, then the state stream
    std::vector<std::string> mirrors;  // hidden copies of the owner's streams it reads
    std::map<std::string, uint64_t> first;  // per hidden stream, its first sequence number
    double reported_cpu = 0;                // CPU seconds counted into the ledger so far
    // Since when its contract is out of force (zero: in force): the run
    // ends and its streams go kHostedGrace later, if the owner has not
    // ended it by then (the owner drains them first).
    std::chrono::steady_clock::time_point out_of_force_since{};
    // Since when the link to the owner's node is down (zero: up). The owner
    // takes the fragment back after its own kHostLost; the run (or
    // standby) ends here kHostedGrace later, so that nothing of a run the
    // owner gave up stays here.
    std::chrono::steady_clock::time_point owner_link_down_since{};
    // A warm standby of it, built before the pause (cluster_hosted_warm.cpp):
    // set until hosting.run promotes it into `runner`.
    std::shared_ptr<QueryRunner> standby{};
    std::string state_copy{};       // the copy of the owner's state stream it reads
    uint64_t state_copy_ready = 0;  // the copy holds a checkpoint once it reaches this
    uint64_t standby_journal = 0;   // the next journal entry it needs
    bool standby_warm = false;      // its checkpoint restored, replaying the journal
    std::string standby_error{};    // why it stopped (or what it waits for)
    std::chrono::steady_clock::time_point standby_since{};
  };
  // The move route's hosted branch, once the contract and the host admit
  // it: runs the move on the hosted thread and answers. `warm`: with a
  // standby on the host first (cluster_hosted_warm.cpp), else the state
  // goes in the pause.
  void start_hosted_move(const std::string& query, const std::string& fragment, const std::string& host_domain,
                         const std::string& host_node, const std::string& contract, uint64_t price, uint64_t load,
                         bool warm, http::Respond answer);
  http::Response run_hosted_move(const std::string& query, const std::string& fragment,
                                 const std::string& host_domain, const std::string& host_node,
                                 const std::string& contract, uint64_t price, uint64_t load, bool warm);
  // The loads (CPU ms/s, as admitted) of this node's fragments `domain` hosts.
  uint64_t hosted_load_on(const std::string& domain);
  // Takes a hosted fragment back to run here; the answer to a move back.
  http::Response take_back(const std::string& runner, const std::string& why);
  // The hosted run of `runner` as GET .../fragments/{f} shows it; nullopt
  // when it is not hosted.
  std::optional<std::string> hosted_fragment_json(const std::string& runner);
  bool fragment_is_hosted(const std::string& runner);
  // Whether the query's entry (its JSON) marks `fragment` hosted.
  static bool fragment_hosted_in_entry(const std::string& entry_json, const std::string& fragment);
  // A fragment the entry marks hosted from this node, which holds no run of
  // it (it restarted meanwhile): taken back.
  void take_back_after_restart(const std::string& query, const std::string& fragment, const std::string& body_json,
                               const std::string& hosted_json);
  // One pass of the relays: what the hosts wrote, appended here.
  void relay_hosted();
  // Contracts out of force, hosts gone: their fragments taken back.
  void check_hosted();
  void hosted_loop();
  void post_hosted(std::function<void()> job);
  void stop_hosted();
  // Host side (federation::Host::on_hosting).
  void on_hosting(const certs::Identity& peer, const std::string& type, const std::string& message,
                  std::function<void(bool, const std::string&, const std::string&)> answer);
  void serve_hosted_run(const certs::Identity& owner, const std::string& message,
                        std::function<void(bool, const std::string&, const std::string&)> answer);
  void end_hosted_here(const std::string& key, bool release);
  // Steps of run_hosted_move and serve_hosted_run.
  // hosting.run: warm (the standby there takes over), or the state sent
  // first in hosting.chunks. The answer's body, or why not.
  Result<std::string> call_hosted_run(federation::Hosting& hosting, const certs::Identity& host, const QueryMeta& meta,
                                      const std::string& contract, const std::string& body,
                                      const QueryRunner::State& state, uint64_t state_next, uint64_t load, bool warm);
  Status grant_hosted_reads(const std::string& host_domain, const std::vector<std::string>& streams,
                            const std::string& query, const std::string& fragment, const std::string& contract);
  Status send_hosted_state(federation::Hosting& hosting, const certs::Identity& host, const std::string& query,
                           const std::string& fragment, const std::string& snapshot);
  // The owner's reads of the host's streams (mirror -> stream here): the
  // error, empty once all are open.
  std::string open_hosted_relays(const std::vector<std::pair<std::string, std::string>>& relays,
                                 const std::string& where);
  // The host's hidden copies of the owner's streams (name, schema), each
  // from its position in `from`: the error, empty once all are open.
  std::string open_hosted_copies(const std::string& key, const std::string& owner_domain,
                                 const std::vector<std::pair<std::string, engine::SchemaPtr>>& copies,
                                 const std::vector<uint64_t>& from);
  Result<std::shared_ptr<QueryRunner>> start_hosted_runner(const std::string& key, const std::string& owner_domain,
                                                           const QueryMeta& meta, const std::vector<StreamPtr>& ins,
                                                           const std::vector<StreamPtr>& outs,
                                                           const StreamPtr& state_log, const QueryRunner::State& state);
  void report_hosted_usage();
  // Warm standbys on the host (cluster_hosted_warm.cpp). Owner side: asks
  // the host for one and waits until it has caught up with `q`; "" once it
  // has, else why not (the move then sends the state in the pause).
  std::string warm_on_host(federation::Hosting& hosting, const certs::Identity& host, const std::string& contract,
                           const std::string& body, uint64_t load, const std::shared_ptr<QueryRunner>& q);
  // Host side: hosting.warm (builds one, or says how far it is).
  void serve_hosted_warm(const certs::Identity& owner, const std::string& message,
                         std::function<void(bool, const std::string&, const std::string&)> answer);
  void build_hosted_standby(const certs::Identity& owner, const std::string& message,
                            std::function<void(bool, const std::string&, const std::string&)> answer);
  // Each standby reads what its copies gained (the hosted thread).
  void warm_hosted_standbys();
  // hosting.run of a run warmed here: the standby of `key`, promoted to
  // write `outs` and `state_log` (their names: `out_names`, `state_name`)
  // once it replayed the owner's journal up to `journal_next`; "" or why
  // not. `catch_up_ms`: how long the copy and the replay took.
  std::string promote_hosted_standby(const std::string& key, uint64_t state_next, uint64_t journal_next,
                                     const std::vector<StreamPtr>& outs, const std::vector<std::string>& out_names,
                                     const StreamPtr& state_log, const std::string& state_name,
                                     double& catch_up_ms);
  // The copies a hosted fragment reads (`copies`: the owner's streams, as
  // named here, with their schemas) and its runner's inputs in `meta`;
  // "" or why not.
  std::string hosted_inputs(const std::string& owner_domain, const engine::QueryNetwork& net,
                            const std::set<std::string>& reads, const std::vector<uint64_t>& positions,
                            QueryMeta& meta, std::vector<std::pair<std::string, engine::SchemaPtr>>& copies);
  QueryRunner::Env hosted_env(const std::string& key, const std::string& owner_domain);
  // The hidden streams a hosted run writes (its outputs, then its state
  // stream), each starting at the owner's next number; their names and
  // internal outputs into `meta`. "" or why not.
  std::string create_hosted_streams(const std::string& key, const std::string& owner_domain,
                                    const engine::QueryNetwork& net, const std::set<std::string>& writes,
                                    const std::vector<uint64_t>& out_next, uint64_t state_next, QueryMeta& meta,
                                    std::vector<StreamPtr>& outs, StreamPtr& state_log);
  // Whether `domain` may read `stream` whole for a hosted run (either side).
  bool may_read_hosted(const std::string& stream, const std::string& domain);
  // A hidden stream of a hosted run on this node (host side), or null.
  StreamPtr find_hosted_stream(const std::string& name);
  // Host side: `domain` acknowledged `stream` through `through`.
  void on_hosted_ack(const std::string& stream, const std::string& domain, uint64_t through);
  // Creating a copy of an owner's stream for a hosted run: hidden.
  bool hosted_mirror_wanted(const std::string& name);
  // A hidden stream of a hosted run, or a copy being made for one: no
  // stream or import of this node's API.
  bool hosted_hidden(const std::string& name);
  Result<StreamPtr> create_hidden_stream(StreamMeta meta, uint64_t first);
  std::mutex hosted_mu_;
  std::condition_variable hosted_cv_;
  std::map<std::string, HostedRun> hosted_;          // REQUIRES: hosted_mu_; by runner name
  std::map<std::string, HostedHere> hosting_here_;   // REQUIRES: hosted_mu_; by OWNER/runner
  std::map<std::string, StreamPtr> hosted_streams_;  // REQUIRES: hosted_mu_; hidden streams by name
  std::set<std::string> hosted_mirrors_wanted_;      // REQUIRES: hosted_mu_
  std::set<std::string> taking_back_;                // REQUIRES: hosted_mu_; runners queued for take_back_after_restart
  std::map<std::string, std::string> hosted_chunks_;  // REQUIRES: hosted_mu_; snapshots arriving, by OWNER/runner
  // Host side: replication waits on the owner's acknowledgements.
  struct AckWait {
    std::string stream, domain;
    uint64_t last;
    std::function<void(const Status&)> release;
  };
  std::vector<AckWait> ack_waits_;                   // REQUIRES: hosted_mu_
  std::deque<std::function<void()>> hosted_jobs_;    // REQUIRES: hosted_mu_
  bool hosted_stopping_ = false;                     // REQUIRES: hosted_mu_
  std::thread hosted_thread_;
  // --- splitting a fragment by key groups (cluster_splits.cpp)
  // POST /v1/queries/{name}/fragments/{fragment}/split.
  void split_fragment_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  struct SplitJob {
    bool merge = false;  // the reverse: the parts of split fragment `fragment` joined
    std::string query;
    std::string fragment;
    std::vector<engine::SplitPartSpec> parts;
    http::Request req;  // the caller's, for the fragments' deploys
    http::Respond answer;
  };
  // The split records of a query's entry as GET /v1/queries/{name}
  // shows them (without the bodies kept for the merge).
  static std::string split_records_json(const rapidjson::Value& splits);
  // POST /v1/queries/{name}/fragments/{fragment}/merge: the parts of a
  // split fragment joined back into it.
  void merge_fragment_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  // POST /v1/queries/{name}/fragments/{fragment}/state {"consumed": [SEQ
  // per input]}: once the fragment's runner has read its inputs up to
  // there, its state (QueryRunner::stopped_state) as a seed's JSON.
  void fragment_state_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  http::Response run_merge(const SplitJob& job);
  // Queues a split or a merge on the split thread (one per fragment).
  void enqueue_split(SplitJob job);
  // `req` forwarded to `node`, waited for up to `bound` (nullopt: no answer).
  std::optional<http::Response> call_node(const http::Request& req, const std::string& node,
                                          std::chrono::steady_clock::duration bound);
  // Waits (up to 30 s each) until each (fragment, node) holds a checkpoint.
  bool await_checkpoints(const http::Request& caller, const std::string& query,
                         const std::vector<std::pair<std::string, std::string>>& fragments);
  // Once part `part` on `node` has read each of its inputs (stream,
  // target; a split join's part has two, in its inputs' order) up to its
  // target (polled, up to 30 s), its state (POST .../state).
  Result<QueryRunner::State> drained_part_state(const http::Request& caller, const std::string& query,
                                                const std::string& part, const std::string& node,
                                                const std::vector<std::pair<std::string, uint64_t>>& reads);
  // A split's router on this node (stopped if it runs) goes with its
  // streams, `outputs` and its state stream (not the mirror of its input,
  // which the fragment reads).
  void drop_split_router(const std::string& runner, const std::vector<std::string>& outputs);
  void split_loop();
  // The split, on the split thread: the answer to give.
  http::Response run_split(const SplitJob& job);
  void stop_splits();
  std::mutex split_mu_;
  std::condition_variable split_cv_;
  std::deque<SplitJob> split_queue_;  // REQUIRES: split_mu_
  std::set<std::string> splitting_;   // REQUIRES: split_mu_; QUERY/FRAGMENT
  bool split_stopping_ = false;       // REQUIRES: split_mu_
  std::thread split_thread_;
  // The PUT body the coordinator stored for fragment `meta` in the query's
  // entry; empty when there is none.
  std::string fragment_body_of(const QueryMeta& meta) const;
  // Stops fragment `meta` and runs it again from its state stream,
  // reading its internal inputs where they are led now.
  void restart_fragment(const QueryMeta& meta, const std::string& why);
  // The second half: runs detached fragment `meta` again from `body`.
  void rerun_fragment(const QueryMeta& meta, const std::string& body);
  // A take-over or rerun that failed because a copy of an input is still
  // being made (kNotCopiedYet): the membership thread ticks at once rather
  // than at its period's end, and that tick (run_placed_fragments) runs it
  // again.
  void retry_soon_if_copying(const Error& e);
  // Runs the fragments the catalog places on this node whose state stream
  // it leads and that do not run (a failed rerun or takeover).
  void run_placed_fragments();
  // Removes query `name`'s runner (stopped) and its record, keeping its
  // streams: it runs again from them (run_fragment with takeover).
  Status detach_query(const std::string& name);
  // Removes a stream and its log whatever produced it (a copy superseded
  // by a failover); conflict while a query here reads it.
  Status discard_stream(const std::string& name);
  std::mutex takeover_serial_mu_;  // one take-over look at a time
  std::mutex takeover_mu_;         // guards what follows
  std::set<std::string> takeover_waiting_;  // REQUIRES: takeover_mu_; logged once
  std::set<std::string> rerunning_;  // REQUIRES: takeover_mu_; reruns under way
  std::map<std::string, int64_t> failed_restarts_;  // REQUIRES: takeover_mu_; last, wall ms
  // The streams of fragments being deployed here, from before they exist
  // until replicate_fragment_streams has written their catalog entries
  // with their followers: reconcile_streams must not register them first
  // (without followers, they could never fail over).
  std::set<std::string> registering_;  // REQUIRES: takeover_mu_
  // Fragments placed here that cannot run from their checkpoint and
  // journal, ever: an input's log no longer holds what they need
  // (QueryRunner::recover's Errc::conflict; e.g. another domain trimmed
  // its stream). Runner -> why; not run again, shown by GET.
  std::map<std::string, std::string> fragments_lost_;  // REQUIRES: takeover_mu_
  // Records (and logs once) why fragment `runner` cannot run, when `e`
  // says it never will; false otherwise (tried again).
  bool fragment_lost(const std::string& runner, const Error& e);
  // --- replicated stream logs (cluster_streams.cpp, docs/cluster.md)
  // Holds a replica of each stream whose catalog entry names this node a
  // follower, and drops the replicas no entry names any more.
  void reconcile_replicas();
  // True for a local mirror "@LEADER/NAME" that is a follower's replica.
  bool is_replica(const std::string& name) const;
  // The copy "@LEADER/NAME" this node holds of `stream`, from whichever
  // leader; empty when none.
  std::string replica_of(const std::string& stream) const;

  // --- failover of stream leaders (cluster_failover.cpp, docs/cluster.md)
  // Why this node must not acknowledge an append to `stream` now, if it
  // must not: the catalog names another leader, or (for a stream with
  // followers) this node's lease is not current or not yet the one the
  // entry records.
  std::optional<Error> leadership_fence(const std::string& stream) const;
  // Records this node's current lease in the entries of the replicated
  // streams it leads (a compare-and-set each): after its lease expired and
  // it registered anew, it acknowledges again only if no failover took
  // the stream meanwhile.
  void confirm_leadership();
  // The controller's part: a replicated stream whose leader is down passes
  // to the first up member of its in-sync set (compare-and-set, epoch + 1).
  void fail_over_streams(const cluster::MembershipView& view);
  // Every node's part: a copy whose stream the catalog now says this node
  // leads becomes the stream; a stream this node led that another node now
  // leads is discarded (it rejoins as a follower through
  // reconcile_replicas).
  void reconcile_leadership();
  // Makes the copy `mirror` the stream `meta` names (its log, sequence
  // numbers and producers stay); the copy must no longer be fed.
  Result<StreamPtr> adopt_replica(const std::string& mirror, StreamMeta meta);
  // Dials `node`'s peer link where the membership says it listens.
  Status dial_domain_node(const std::string& node);
  // Dials the node behind each read of another node's stream (after a
  // restart, the links to them are not configured anywhere else).
  void dial_internal_sources();
  void put_fragment_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void get_fragment_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  void delete_fragment_route(const http::Request& req, const PathParams& params, const http::Respond& answer);
  // The domain's nodes: this one alone, or every node in the membership view.
  std::vector<std::string> domain_nodes() const;
  // --- one contract ledger per domain (cluster_contracts.cpp)
  // Gates this node's ledger on the domain's (etcd) one.
  void share_ledger();
  // Appends the domain's versions this node lacks; records its own that
  // the domain lacks.
  void reconcile_contracts();
  // unavailable when `stream` is neither here nor in the catalog and the
  // catalog has not been read yet (so "no such stream" would be a guess).
  Status catalog_not_read(const std::string& stream) const;
  // "stream NAME" / "query NAME" for each catalog entry placed on `node`.
  std::vector<std::string> list_streams_led_by(const std::string& node) const;
  // Why the domain's catalog cannot be changed now; nullopt when it can.
  std::optional<std::string> etcd_problem() const;
  // The controller's choice for a new stream or query with no placement.
  std::string least_loaded_node(const cluster::MembershipView& view) const;
  // Where `node`'s API is, from the membership view.
  Result<http::UpstreamTarget> target_of(const std::string& node) const;
  http::ForwardOptions forward_options(const http::Request& req) const;
  Status load_catalog();
  uint64_t allocate_id();  // REQUIRES: catalog_mu_ held
  // Puts the next id to allocate into `wb`. REQUIRES: catalog_mu_ held.
  void add_next_id(store::WriteBatch& wb) const;
  // An id written through to the store at once (a stream outside the
  // catalog: a hosted run's, cluster_hosted.cpp).
  Result<uint64_t> allocate_id_durably();
  void maintenance_loop();
  void enforce_retention();
  // Erases what each fragment's state stream, and each follower's copy of
  // one, holds before its last checkpoint. `trims` remembers, per stream,
  // what was erased and how far a copy was read.
  struct StateTrim {
    uint64_t erased_before = 0;
    uint64_t read_next = 0;       // a copy: the next seq to read
    StateCheckpoints checkpoints;  // a copy: its chunks seen so far
  };
  void trim_state_streams(std::map<std::string, StateTrim>& trims);
  // How a query runner reaches the store and the followers.
  QueryRunner::Env runner_env();
  void register_collectors();
  // entente_build_info, entente_cert_expiry_days, entente_import_state
  // (ops_metrics.cpp). read_cert_expiry reads the certificates again: at
  // start-up and after a reload.
  void register_ops_collectors();
  void read_cert_expiry();
  struct CertExpiry {
    std::string which;   // "api", "federation", "pinned_ca"
    std::string domain;  // whose certificate
    std::string subject;
    certs::Clock::time_point not_after;
  };
  std::mutex cert_expiry_mu_;
  std::vector<CertExpiry> cert_expiry_;  // REQUIRES: cert_expiry_mu_
  // Each import's state, read before each scrape (GET /metrics).
  void read_import_states();
  std::mutex import_states_mu_;
  std::vector<std::pair<std::string, std::string>> import_states_;  // REQUIRES: import_states_mu_
  Result<BackupResult> write_backup(const std::string& dir);

  NodeConfig config_;  // tokens: REQUIRES tokens_mu_ (a reload replaces them)
  mutable std::mutex tokens_mu_;
  mutable UiSessions ui_sessions_;  // the dashboard's cookies (ui.cpp)
  UiLive ui_live_{*this};           // the dashboard's live updates (ui_live.cpp)
  Registry metrics_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<store::GroupCommit> gc_;
  std::unique_ptr<EnginePool> pool_;
  std::unique_ptr<http::Server> server_;
  // When the configuration has a federation section: what the federation
  // layer reaches of this node, and the layer itself.
  std::unique_ptr<FederationHost> federation_host_;
  std::unique_ptr<Peering> peering_;
  // When the configuration has a cluster section (docs/cluster.md).
  std::unique_ptr<cluster::Etcd> etcd_;
  std::unique_ptr<cluster::Membership> membership_;
  std::unique_ptr<cluster::Catalog> catalog_;
  // Queries this node is deploying after cluster_place_query (their
  // catalog entries say "deploying": reconcile_streams leaves them be).
  std::mutex contracts_reconcile_mu_;  // one reconcile_contracts at a time
  std::mutex deploying_mu_;
  std::set<std::string> deploying_;  // REQUIRES: deploying_mu_
  // Cut entries (queries/NAME, "deploying") whose creation this node
  // coordinated and etcd did not confirm in time: the write may be applied
  // later, after the deploy answered 503, and nothing of it was deployed.
  // reconcile_streams erases such an entry when it shows up unchanged.
  // At most kMaxUnsureCutEntries, each kept kUnsureCutEntryMs.
  struct UnsureCutEntry {
    std::string json;
    int64_t since_ms = 0;
  };
  std::map<std::string, UnsureCutEntry> unsure_cut_entries_;  // REQUIRES: deploying_mu_
  static constexpr size_t kMaxUnsureCutEntries = 1000;
  static constexpr int64_t kUnsureCutEntryMs = 10 * 60 * 1000;
  // Forwards requests and WebSockets to the other nodes (its own threads).
  std::unique_ptr<http::Upstream> upstream_;
  // CPU time and wall clock at the last node_load().
  std::mutex load_mu_;
  int64_t load_cpu_us_ = 0, load_wall_us_ = 0;  // REQUIRES: load_mu_

  // Appends waiting for their followers (when_replicated), by stream; the
  // followers out of the in-sync set; the thread that times them out.
  struct ReplicaWaiter {
    uint64_t last;
    std::chrono::steady_clock::time_point deadline;
    std::function<void(const Status&)> release;
  };
  void check_replication(const std::string& stream);
  // Rewrites `stream`'s in-sync set in the catalog (compare-and-set):
  // without the followers in `leave` and those whose channel is closed,
  // and, with `join`, with the followers that hold the whole log. True
  // when it changed; an error when etcd did not take it.
  Result<bool> update_in_sync(const std::string& stream, const std::set<std::string>& leave, bool join);
  // The streams this node leads that have followers.
  std::vector<std::string> streams_with_followers() const;
  void replication_loop();
  // Takes out of `stream`'s in-sync set the members an overdue append or
  // hidden record waits for, and those whose channel closed.
  void recheck_in_sync(const std::string& stream);
  void stop_replication();
  // At start-up, in a domain with peer links: what the stream's followers
  // acknowledged before the restart is all readers see until the catalog
  // says who is in sync (docs/cluster.md, "Replicated stream logs").
  void hold_unreplicated();
  // One visibility decision at a time: a stale one must not undo a newer.
  std::mutex visible_mu_;
  mutable std::mutex repl_mu_;
  std::condition_variable repl_cv_;
  std::map<std::string, std::vector<ReplicaWaiter>> repl_waiters_;  // REQUIRES: repl_mu_
  std::set<std::string> repl_recheck_;  // REQUIRES: repl_mu_; streams whose in-sync set may have to change
  bool repl_stopping_ = false;                                      // REQUIRES: repl_mu_
  std::thread repl_thread_;
  // The replicas this node holds as a follower ("@LEADER/NAME"), also
  // under "replica/" in the store's catalog.
  mutable std::mutex replicas_mu_;
  std::set<std::string> replicas_;  // REQUIRES: replicas_mu_
  // One reconcile_leadership at a time (the catalog's watch and the
  // membership's tick both call it).
  std::mutex leadership_mu_;
  // Streams (NAME#EPOCH) the controller found without an in-sync member up,
  // so that each is logged once.
  std::mutex failover_mu_;
  std::set<std::string> failover_waiting_;  // REQUIRES: failover_mu_
  mutable std::shared_mutex catalog_mu_;  // streams_, queries_, next_id_
  std::map<std::string, StreamPtr> streams_;
  std::map<std::string, std::shared_ptr<QueryRunner>> queries_;
  uint64_t next_id_ = 1;

  std::mutex maint_mu_;
  std::condition_variable maint_cv_;
  bool stopping_ = false;  // REQUIRES: maint_mu_
  // The backup asked for and not started yet, and whether one runs.
  struct BackupJob {
    std::string dir;
    std::function<void(Result<BackupResult>)> done;
  };
  std::optional<BackupJob> backup_job_;  // REQUIRES: maint_mu_
  bool backup_running_ = false;          // REQUIRES: maint_mu_
  std::thread maint_thread_;
  std::atomic<bool> stopped_{false};
  int64_t started_ms_ = 0;
};

int64_t wall_clock_ms();

// The API's JSON form of a stream of this node (GET /v1/streams/{name}).
std::string stream_json(const NodeImpl& node, const StreamPtr& s);
// A stream's entry in the domain's catalog (docs/cluster.md, "Keys"):
// its leader, definition and followers.
struct StreamEntry {
  std::string node;
  StreamMeta meta;
  std::vector<std::string> replicas;  // the followers holding a copy
  std::vector<std::string> in_sync;   // those of them in the in-sync set
  uint64_t epoch = 1;                 // the leader's term: +1 at each failover
  // The etcd lease the leader held when it last confirmed its leadership
  // (0: none recorded). A leader acknowledges appends only while this is
  // its current lease (cluster_failover.cpp).
  int64_t lease = 0;
};
Result<StreamEntry> stream_entry_from_json(std::string_view json);
std::string stream_catalog_entry(const StreamEntry& e);
// A new entry: `node` leads, epoch 1, every follower out of sync.
std::string stream_catalog_entry(const StreamMeta& meta, const std::string& node,
                                 const std::vector<std::string>& replicas = {});

Result<QueryPlacement> read_placement(std::string_view body);
// Checks "placement.fragments" against the network and the domain's
// `nodes` (docs/cluster.md): every problem in `diag` with its path. Then
// gives each fragment that names no node one: the node that leads the
// first stream it reads (`leader_of`, "" when unknown), or the node of the
// fragment producing the first internal stream it reads, or `here`. When
// the fragments are then all on one node the query runs whole there
// (`node` set, fragments_json cleared: in a domain of several nodes,
// cluster_place_query makes that a cut of one fragment again,
// whole_query_as_cut); on several, fragments_json is the fragments with
// every node said (cluster_deploy_cut).
Status check_fragments(QueryPlacement& placement, const engine::QueryNetwork& net,
                       const std::vector<std::string>& nodes, const std::string& here,
                       const std::function<std::string(const std::string&)>& leader_of, Diagnostics& diag);
// The placement of `net` whole on `node` in a domain of several nodes: one
// fragment named kWholeQueryFragment holding every box. nullopt when the
// cut is refused (the fragment's network name "QUERY--all" over the name
// limit): the query then runs whole, as in a domain of one node.
std::optional<QueryPlacement> whole_query_as_cut(const engine::QueryNetwork& net, const std::string& node);
// `network_json` with "placement": {"node": NODE}.
std::string with_placement(std::string_view network_json, const std::string& node);

// The API's answer for an error: 404, 409, 403, 503 (Retry-After), 500 or 400.
http::Response problem_for(const Error& e);
// Whether `node` is a member of the domain seen up in `view`.
bool member_up(const cluster::MembershipView& view, const std::string& node);
// An internal stream of a query cut across nodes ("QUERY--..."), or a
// node's copy of one ("@NODE/QUERY--..."): hidden from GET /v1/streams
// unless it asks for them with ?internal=true.
inline bool is_internal_stream(std::string_view name) { return name.find("--") != std::string_view::npos; }
// A node's own catalog keys (in the store's catalog family).
// One line on the node's log (base/log.h): at `level`, from `component`
// ("cluster", "hosting", "query", "store", ...); without them, info from
// "node".
using LogLevel = base::LogLevel;
void log_line(LogLevel level, std::string_view component, const std::string& s);
void log_line(const std::string& s);
// Bytes as lowercase hex, and back (nullopt: not hex).
std::string hex_of(std::string_view bytes);
std::optional<std::string> bytes_of_hex(std::string_view hex);
// Compare-and-set of the query's catalog entry through `edit` (false from
// it: no change), a few tries. False when it could not be written.
bool edit_query_entry(cluster::Catalog& catalog, const std::string& query,
                      const std::function<bool(rapidjson::Document&)>& edit, int64_t wait_ms);
// Replaces member `key` of `d` with `v`.
void set_member(rapidjson::Document& d, const char* key, rapidjson::Value v);
inline std::string node_stream_key(std::string_view name) { return "stream/" + std::string(name); }
inline std::string node_query_key(std::string_view name) { return "query/" + std::string(name); }
inline bool list_internal_streams(const http::Request& req) {
  auto v = req.param("internal");
  return v && (*v == "true" || *v == "1");
}
// Waits for `n` imports being created: `done` runs once, with the first
// failure (an import that exists already counts as success), or with Ok
// after the last success. Returns the callback each creation calls; the
// failure's message is prefixed with its `what`.
std::function<void(Result<ImportInfo>, const std::string& what)> join_imports(size_t n,
                                                                              std::function<void(const Status&)> done);
// A query runner as the API shows it (GET /v1/queries/{name}); `placement`
// is "DOMAIN/NODE".
std::string query_json(const std::shared_ptr<QueryRunner>& q, const std::string& placement, const Peering* peering);

// The "seed" member of a PUT /v1/queries/{q}/fragments/{f} body: the state
// a fragment made by a split starts from (cluster_splits.cpp): {"positions":
// [...], "out_next": [...], "snapshot": HEX, "adopt": [stream, ...]}. The
// snapshot is at most kMaxSeedSnapshotBytes (its hex twice that).
inline constexpr size_t kMaxSeedSnapshotBytes = 4u << 20;
inline constexpr size_t kMaxFragmentSeedBytes = 2 * kMaxSeedSnapshotBytes + (64u << 10);
std::string fragment_seed_json(const NodeImpl::FragmentOf::Seed& seed);
Result<std::shared_ptr<const NodeImpl::FragmentOf::Seed>> read_fragment_seed(std::string_view json);

}  // namespace entente::broker::detail
