#include "broker/node.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <set>
#include <thread>
#include <utility>

#include "broker/detail/node_impl.h"
#include "broker/detail/federation_host.h"
#include "cluster/catalog.h"
#include "cluster/etcd.h"
#include "cluster/membership.h"
#include "federation/peering.h"
#include "engine/fragments.h"
#include "engine/network.h"
#include "store/stream_log.h"

namespace entente::broker {

namespace detail {

void log_line(LogLevel level, std::string_view component, const std::string& s) {
  base::log(level, component, s);
}
void log_line(const std::string& s) { base::log(LogLevel::info, "node", s); }

int64_t wall_clock_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

namespace {

const char* kNextIdKey = "next_id";

std::string stream_key(const std::string& name) { return node_stream_key(name); }
std::string query_key(const std::string& name) { return node_query_key(name); }


// The maintenance thread's nice value. A retention check with a byte bound
// reads a stream's whole log (store/stream_log.cpp); at full priority that
// scan took a core from the network and group-commit threads for tens of
// milliseconds every retention_check_interval, which showed as the p99 of
// publish-to-subscriber latency on a 2-core machine. Niced, it runs in the
// time ingest and subscribers leave.
constexpr int kMaintenanceNice = 10;

bool process_durability(const NodeConfig& c) { return c.ingest_durability == IngestDurability::process; }

// Makes everything written to the store so far durable: a synced write of an
// empty batch fsyncs RocksDB's WAL, which holds every earlier write in order.
// Used with ingest_durability "process", where the group commit does not
// sync, so that query checkpoints and a clean shutdown still reach the disk.
void sync_wal(store::Store& store, const std::string& why) {
  Status s = store.write(store::WriteBatch(), store::Durability::synced);
  if (!s.ok()) log_line(LogLevel::warn, "store", "syncing the write-ahead log after " + why + " failed: " + s.error().message);
}

}  // namespace

NodeImpl::NodeImpl(NodeConfig config) : config_(std::move(config)) {}

NodeImpl::~NodeImpl() { stop(); }

uint64_t NodeImpl::allocate_id() { return next_id_++; }

void NodeImpl::add_next_id(store::WriteBatch& wb) const {
  std::string id;
  store::put_key_u64(id, next_id_);
  wb.put(store::Cf::meta, kNextIdKey, id);
}

Result<uint64_t> NodeImpl::allocate_id_durably() {
  std::unique_lock lock(catalog_mu_);
  const uint64_t id = allocate_id();
  std::string next;
  store::put_key_u64(next, next_id_);
  ENTENTE_RETURN_IF_ERROR(store_->put(store::Cf::meta, kNextIdKey, next, store::Durability::synced));
  return id;
}

Status NodeImpl::open() {
  std::error_code ec;
  std::filesystem::create_directories(config_.data_dir, ec);
  if (ec) return make_error(Errc::io_error, "data_dir " + config_.data_dir + ": " + ec.message());
  store::StoreOptions so;
  so.path = (std::filesystem::path(config_.data_dir) / "store").string();
  auto opened = store::Store::open(so);
  if (!opened.ok()) {
    Error e = opened.error();
    // A second node started on a data_dir in use (unavailable: RocksDB's
    // lock is held): say so in the operator's terms.
    if (e.code == Errc::unavailable) {
      e.message = "data_dir '" + config_.data_dir + "' is in use: " + e.message +
                  ". Another entente broker runs on this data_dir; stop it, or give this node a "
                  "data_dir of its own";
    }
    return e;
  }
  store_ = std::move(opened).value();
  store::GroupCommitOptions go;
  go.max_pending_bytes = config_.ingest_queue_bytes;
  // "process": the ack waits for RocksDB's WAL write (a write(2) into the page
  // cache), not for its fsync. Catalog writes go to the store directly with
  // Durability::synced and are not affected.
  go.durability = process_durability(config_) ? store::Durability::buffered : store::Durability::synced;
  gc_ = std::make_unique<store::GroupCommit>(*store_, go);
  gc_->start();
  pool_ = std::make_unique<EnginePool>(config_.engine_threads);
  return load_catalog();
}

Status NodeImpl::load_catalog() {
  std::unique_lock lock(catalog_mu_);
  ENTENTE_ASSIGN_OR_RETURN(auto id, store_->get(store::Cf::meta, kNextIdKey));
  if (id) {
    if (id->size() != 8) return make_error(Errc::corrupt, "meta: next_id is corrupt");
    next_id_ = store::get_key_u64(*id);
  }
  std::vector<StreamMeta> metas;
  Status bad = Status::Ok();
  ENTENTE_RETURN_IF_ERROR(store_->scan(store::Cf::catalog, "stream/", [&](std::string_view, std::string_view v) {
    auto m = stream_meta_from_json(v);
    if (!m.ok()) {
      bad = m.error();
      return false;
    }
    metas.push_back(std::move(m).value());
    return true;
  }));
  ENTENTE_RETURN_IF_ERROR(bad);
  for (auto& m : metas) {
    ENTENTE_ASSIGN_OR_RETURN(auto last, store::StreamLog::last(*store_, m.id));
    const uint64_t next = last ? last->last + 1 : 1;
    std::vector<store::StreamLog::ProducerBatch> producers;
    ENTENTE_RETURN_IF_ERROR(store::StreamLog::producer_batches(*store_, m.id, producers));
    auto s = std::make_shared<Stream>(std::move(m), next);
    s->load_producers(std::move(producers));
    s->tuples_in = &metrics_.counter("entente_stream_tuples_total", "Tuples appended to a stream",
                                     {{"stream", s->meta().name}});
    s->bytes_in = &metrics_.counter("entente_stream_bytes_total", "Encoded bytes appended to a stream",
                                    {{"stream", s->meta().name}});
    streams_[s->meta().name] = std::move(s);
  }
  // The replicas this node holds as a follower (docs/cluster.md).
  ENTENTE_RETURN_IF_ERROR(store_->scan(store::Cf::catalog, "replica/", [&](std::string_view k, std::string_view) {
    if (!k.starts_with("replica/")) return false;
    std::lock_guard rl(replicas_mu_);
    replicas_.insert(std::string(k.substr(8)));
    return true;
  }));
  std::vector<QueryMeta> queries;
  ENTENTE_RETURN_IF_ERROR(store_->scan(store::Cf::catalog, "query/", [&](std::string_view, std::string_view v) {
    auto m = query_meta_from_json(v);
    if (!m.ok()) {
      bad = m.error();
      return false;
    }
    queries.push_back(std::move(m).value());
    return true;
  }));
  ENTENTE_RETURN_IF_ERROR(bad);
  for (auto& q : queries) {
    std::vector<StreamPtr> ins, outs;
    for (auto& n : q.inputs) {
      auto it = streams_.find(n);
      if (it == streams_.end())
        return make_error(Errc::corrupt, "catalog: query '" + q.name + "' reads missing stream '" + n + "'");
      ins.push_back(it->second);
    }
    for (auto& n : q.outputs) {
      auto it = streams_.find(n);
      if (it == streams_.end())
        return make_error(Errc::corrupt, "catalog: query '" + q.name + "' writes missing stream '" + n + "'");
      outs.push_back(it->second);
    }
    // A fragment's journal and checkpoints (docs/cluster.md, "A fragment's
    // state stream").
    StreamPtr state;
    if (!q.state_stream.empty()) {
      auto it = streams_.find(q.state_stream);
      if (it == streams_.end())
        return make_error(Errc::corrupt,
                          "catalog: query '" + q.name + "' keeps its state in missing stream '" + q.state_stream + "'");
      state = it->second;
    }
    const std::string name = q.name;
    ENTENTE_ASSIGN_OR_RETURN(auto runner, QueryRunner::create(std::move(q), std::move(ins), std::move(outs),
                                                              runner_env(), std::move(state)));
    Status s = runner->recover();
    if (!s.ok()) return make_error(s.error().code, "recovering query '" + name + "': " + s.error().message);
    queries_[name] = std::move(runner);
  }
  return Status::Ok();
}

QueryRunner::Env NodeImpl::runner_env() {
  QueryRunner::Env env{store_.get(), gc_.get(), pool_.get(), &metrics_, nullptr};
  env.when_replicated = [this](const std::string& stream, uint64_t last, std::function<void(const Status&)> release) {
    // Stopping (the final drain): the lease is revoked and the peer links
    // are closed, so the followers get nothing more; what is written now
    // stays here, as a stale leader's writes do (docs/cluster.md,
    // "Failover of a stream's leader").
    if (stopped_.load()) {
      release(Status::Ok());
      return;
    }
    // Led by another node now (a failover while this node was away): the
    // fragment runs there, and this run stops at once rather than asking
    // again as it does while the catalog is unread.
    if (catalog_ && catalog_->revision() != 0) {
      if (auto leader = stream_leader(stream); leader && *leader != config_.node) {
        release(Error{Errc::conflict, "stream '" + stream + "' is led by " + *leader + " now, not by " + config_.node});
        return;
      }
    }
    when_replicated(stream, last, std::move(release));
  };
  return env;
}

Status NodeImpl::start() {
  started_ms_ = wall_clock_ms();
  register_collectors();
  register_ops_collectors();
  hold_unreplicated();  // before any reader follows a stream
  {
    std::shared_lock lock(catalog_mu_);
    for (auto& [_, q] : queries_) q->start();
  }
  maint_thread_ = std::thread([this] { maintenance_loop(); });
  http::ServerOptions so;
  so.address = config_.listen_address;
  so.port = config_.listen_port;
  so.tls = config_.tls;
  so.cert_file = config_.tls_cert_file;
  so.key_file = config_.tls_key_file;
  so.threads = config_.network_threads;
  so.max_body_bytes = config_.limits.max_body_bytes;
  so.max_header_bytes = config_.limits.max_header_bytes;
  so.read_timeout_ms = config_.limits.read_timeout_ms;
  so.idle_timeout_ms = config_.limits.idle_timeout_ms;
  so.max_connections = config_.limits.max_connections;
  so.max_connections_per_address = config_.limits.max_connections_per_address;
  so.handshake_timeout_ms = config_.limits.handshake_timeout_ms;
  so.ws_max_message_bytes = config_.limits.ws_max_message_bytes;
  so.ws_send_buffer_bytes = config_.limits.ws_send_buffer_bytes;
  so.ws_ping_interval_ms = config_.limits.ws_ping_interval_ms;
  ENTENTE_ASSIGN_OR_RETURN(server_, http::Server::create(so, *this));
  // Peer links before the API: an import created right after start-up
  // finds its links dialing.
  if (config_.federation.enabled) {
    federation_host_ = std::make_unique<FederationHost>(*this);
    peering_ = std::make_unique<Peering>(*federation_host_, certs::Identity{config_.domain, config_.node},
                                         config_.federation);
    ENTENTE_RETURN_IF_ERROR(peering_->start());
  }
  ENTENTE_RETURN_IF_ERROR(server_->start());
  return start_cluster();
}

void NodeImpl::stop() {
  if (stopped_.exchange(true)) return;
  // The dashboard's snapshots ask the routes: they end before anything else.
  ui_live_.stop();
  auto flush = [this] {
    if (!gc_) return;
    std::promise<void> p;
    auto f = p.get_future();
    if (gc_->submit(store::WriteBatch(), [&p](const Status&) { p.set_value(); }, store::Admission::wait).ok())
      f.wait();
  };
  // Moves under way end first (each rolls back or answers as it stands),
  // and stops and starts of fragments.
  stop_lifecycle();
  stop_moves();
  stop_standbys();
  stop_splits();
  stop_hosted();
  // 0. Leave the domain: the lease is revoked, so the others see this node
  // down and another takes the controller role now, not at the lease's
  // expiry.
  if (membership_) membership_->stop(true);
  if (catalog_) catalog_->stop();
  // 1. No new connections; what was accepted is answered.
  if (server_) server_->stop_accepting();
  flush();
  // Appends waiting for their followers are answered now: they are
  // durable here, and the server's stop waits for every answer.
  stop_replication();
  if (server_) server_->stop();
  // Forwarded requests and relayed WebSockets end with the API.
  if (upstream_) upstream_->stop();
  // Peer links: importers re-open from what they stored when the node is
  // back; nothing they have not acknowledged is released.
  if (peering_) peering_->stop();
  flush();
  // 2. Every query consumes what was committed and checkpoints.
  std::vector<std::shared_ptr<QueryRunner>> queries;
  {
    std::shared_lock lock(catalog_mu_);
    for (auto& [_, q] : queries_) queries.push_back(q);
  }
  for (auto& q : queries) {
    if (q->info().state != "running") continue;
    auto r = q->drain_and_checkpoint();
    if (!r.ok()) log_line(LogLevel::warn, "query", "final checkpoint of query '" + q->meta().name + "' failed: " + r.error().message);
  }
  for (auto& q : queries) q->stop();
  // 3. Background work, then the store.
  {
    std::lock_guard lock(maint_mu_);
    stopping_ = true;
  }
  maint_cv_.notify_all();
  if (maint_thread_.joinable()) maint_thread_.join();
  // A backup asked for but never started.
  std::optional<BackupJob> pending;
  {
    std::lock_guard lock(maint_mu_);
    pending = std::exchange(backup_job_, std::nullopt);
  }
  if (pending) pending->done(make_error(Errc::unavailable, "the node is stopping"));
  if (pool_) pool_->stop();
  if (gc_) gc_->stop();
  // The final checkpoints, and the tuples before them, reach the disk before
  // a clean exit, in either mode.
  if (store_ && process_durability(config_)) sync_wal(*store_, "the final checkpoints");
  {
    std::unique_lock lock(catalog_mu_);
    queries_.clear();
    streams_.clear();
  }
  server_.reset();
  gc_.reset();
  store_.reset();
}

Status NodeImpl::reload(NodeConfig next, std::vector<std::string>& changes, std::vector<std::string>& kept) {
  auto differs = [&](bool changed, const char* key) {
    if (changed) kept.push_back(key);
  };
  const NodeConfig& now = config_;
  differs(next.domain != now.domain, "domain");
  differs(next.node != now.node, "node");
  differs(next.listen_address != now.listen_address || next.listen_port != now.listen_port, "api.listen");
  differs(next.tls != now.tls, "api.tls (on or off)");
  differs(next.data_dir != now.data_dir, "data_dir");
  const ApiLimits &a = next.limits, &b = now.limits;
  differs(a.max_body_bytes != b.max_body_bytes || a.max_header_bytes != b.max_header_bytes ||
              a.read_timeout_ms != b.read_timeout_ms || a.idle_timeout_ms != b.idle_timeout_ms ||
              a.max_connections != b.max_connections || a.ws_max_message_bytes != b.ws_max_message_bytes ||
              a.ws_send_buffer_bytes != b.ws_send_buffer_bytes ||
              a.ws_ping_interval_ms != b.ws_ping_interval_ms,
          "api.limits");
  differs(next.retention.max_tuples != now.retention.max_tuples ||
              next.retention.max_bytes != now.retention.max_bytes ||
              next.retention.max_age_ms != now.retention.max_age_ms,
          "retention");
  differs(next.checkpoint_interval_ms != now.checkpoint_interval_ms, "checkpoint_interval");
  differs(next.ingest_durability != now.ingest_durability, "ingest_durability");
  differs(next.retention_check_interval_ms != now.retention_check_interval_ms, "retention_check_interval");
  differs(next.network_threads != now.network_threads || next.engine_threads != now.engine_threads,
          "threads");
  differs(next.ingest_queue_bytes != now.ingest_queue_bytes ||
              next.query_max_lag_tuples != now.query_max_lag_tuples || next.max_streams != now.max_streams ||
              next.max_queries != now.max_queries,
          "limits");
  differs(next.federation.enabled != now.federation.enabled, "federation (added or removed)");

  // What can fail is checked before anything changes: the API
  // certificate here, the federation's files inside Peering::reload, which
  // applies nothing when they are wrong.
  const bool api_tls = server_ && next.tls && now.tls;
  if (api_tls) {
    if (Status s = server_->check_certificate(next.tls_cert_file, next.tls_key_file); !s.ok()) {
      return make_error(s.error().code, "api.tls: " + s.error().message);
    }
  }
  const bool federation = peering_ && next.federation.enabled;
  if (federation) {
    ENTENTE_RETURN_IF_ERROR(peering_->reload(next.federation, changes, kept));
    config_.federation.cert_file = next.federation.cert_file;
    config_.federation.key_file = next.federation.key_file;
    config_.federation.ca_file = next.federation.ca_file;
    config_.federation.peers = next.federation.peers;
  }
  if (api_tls) {
    // Checked above; fails only when the files changed meanwhile.
    auto changed = server_->reload_certificate(next.tls_cert_file, next.tls_key_file);
    if (!changed.ok()) {
      return make_error(changed.error().code, "api.tls: " + changed.error().message +
                                                  (federation ? " (the federation section was reloaded; the "
                                                                "tokens are unchanged)"
                                                              : ""));
    }
    if (*changed) {
      changes.push_back("API certificate " + next.tls_cert_file + ": new connections present the new one");
    }
    config_.tls_cert_file = next.tls_cert_file;
    config_.tls_key_file = next.tls_key_file;
  }
  {
    std::lock_guard lock(tokens_mu_);
    auto names = [](const std::vector<TokenEntry>& ts) {
      std::map<std::string, std::pair<std::string, Role>> out;
      for (const auto& t : ts) out[t.name] = {t.sha256, t.role};
      return out;
    };
    const auto before = names(config_.tokens), after = names(next.tokens);
    for (const auto& [name, v] : after) {
      auto it = before.find(name);
      if (it == before.end()) {
        changes.push_back("token '" + name + "' added (" + std::string(role_name(v.second)) + ")");
      } else if (it->second != v) {
        changes.push_back("token '" + name + "' replaced (" + std::string(role_name(v.second)) + ")");
      }
    }
    for (const auto& [name, v] : before) {
      if (!after.count(name)) changes.push_back("token '" + name + "' removed");
    }
    config_.tokens = std::move(next.tokens);
  }
  read_cert_expiry();  // the certificates may have been replaced
  return Status::Ok();
}

void NodeImpl::maintenance_loop() {
  int64_t next_cp = wall_clock_ms() + config_.checkpoint_interval_ms;
  int64_t next_ret = wall_clock_ms() + config_.retention_check_interval_ms;
  // With ingest_durability "process" the group commit writes checkpoints
  // without fsync; a checkpoint callback (on the committer thread, which must
  // not block on a disk flush) sets this and this thread syncs the WAL.
  // Shared with the callbacks, which may outlive the loop. REQUIRES: maint_mu_.
  auto checkpoint_unsynced = std::make_shared<bool>(false);
  std::map<std::string, StateTrim> state_trimmed;  // trim_state_streams
  const bool sync_checkpoints = process_durability(config_);
  // Linux applies a thread's own nice value (the thread id as the "process");
  // when it fails the work runs at normal priority, which is only slower.
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kMaintenanceNice) != 0)
    log_line(LogLevel::warn, "node", "could not lower the maintenance thread's priority; retention checks compete with ingest");
  std::unique_lock lock(maint_mu_);
  while (!stopping_) {
    const int64_t wake = std::min(next_cp, next_ret);
    maint_cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(1, wake - wall_clock_ms())),
                       [&] { return stopping_ || *checkpoint_unsynced || backup_job_.has_value(); });
    if (stopping_) break;
    const bool sync_now = std::exchange(*checkpoint_unsynced, false);
    std::optional<BackupJob> job = std::exchange(backup_job_, std::nullopt);
    const int64_t now = wall_clock_ms();
    lock.unlock();
    base::process_log().flush_repeats();  // repeated refusals whose window ended
    if (sync_now) sync_wal(*store_, "a checkpoint");
    if (job) {
      auto result = write_backup(job->dir);
      if (result.ok()) {
        log_line(LogLevel::info, "store", "backup of the store in " + result->dir + " (" + std::to_string(result->store.bytes) +
                 " bytes, up to RocksDB sequence " + std::to_string(result->store.sequence) + ")");
      } else {
        log_line(LogLevel::warn, "store", "backup to " + job->dir + " failed: " + result.error().message);
      }
      {
        std::lock_guard l(maint_mu_);
        backup_running_ = false;
      }
      job->done(std::move(result));
    }
    if (now >= next_cp) {
      for (auto& q : checkpointed_runners()) {
        if (q->info().state == "running")
          q->request_checkpoint([this, name = q->meta().name, sync_checkpoints,
                                 checkpoint_unsynced](const Result<CheckpointInfo>& r) {
            if (!r.ok()) {
              log_line(LogLevel::warn, "query", "checkpoint of query '" + name + "' failed: " + r.error().message);
              return;
            }
            if (!sync_checkpoints) return;
            {
              std::lock_guard l(maint_mu_);
              *checkpoint_unsynced = true;
            }
            maint_cv_.notify_all();
          });
      }
      next_cp = now + config_.checkpoint_interval_ms;
      trim_state_streams(state_trimmed);
    }
    if (now >= next_ret) {
      enforce_retention();
      next_ret = now + config_.retention_check_interval_ms;
    }
    lock.lock();
  }
}

void NodeImpl::backup(std::string dir, std::function<void(Result<BackupResult>)> done) {
  {
    std::lock_guard lock(maint_mu_);
    if (stopping_) {
      done(make_error(Errc::unavailable, "the node is stopping"));
      return;
    }
    if (backup_running_) {
      done(make_error(Errc::unavailable, "a backup is running already; ask again when it is done"));
      return;
    }
    backup_running_ = true;
    backup_job_ = BackupJob{std::move(dir), std::move(done)};
  }
  maint_cv_.notify_all();
}

Result<NodeImpl::BackupResult> NodeImpl::write_backup(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path target(dir);
  if (dir.empty() || !target.is_absolute()) {
    return make_error(Errc::invalid_argument, "the backup directory must be an absolute path on the node's "
                                              "machine, not '" + dir + "'");
  }
  std::error_code ec;
  if (fs::exists(fs::symlink_status(target, ec))) {
    return make_error(Errc::already_exists, "backup directory '" + dir + "' exists already; name a new one");
  }
  if (!fs::is_directory(target.parent_path(), ec)) {
    return make_error(Errc::not_found, "the parent of backup directory '" + dir + "' ('" +
                                           target.parent_path().string() + "') is not a directory");
  }
  // Nothing is left behind by a backup that fails half-way.
  if (!fs::create_directory(target, ec) || ec) {
    return make_error(Errc::io_error, "cannot create backup directory '" + dir + "': " + ec.message());
  }
  auto remove = [&] {
    std::error_code ignored;
    fs::remove_all(target, ignored);
  };
  BackupResult out;
  out.dir = dir;
  out.created_ms = wall_clock_ms();
  auto copied = store_->backup((target / "store").string());
  if (!copied.ok()) {
    remove();
    return copied.error();
  }
  out.store = std::move(copied).value();
  // Says what the directory is, for the admin who finds it later.
  const std::string description =
      "{\"domain\":\"" + config_.domain + "\",\"node\":\"" + config_.node +
      "\",\"created_at_ms\":" + std::to_string(out.created_ms) +
      ",\"rocksdb_sequence\":" + std::to_string(out.store.sequence) + ",\"store\":\"store\"}\n";
  {
    std::FILE* f = std::fopen((target / "backup.json").c_str(), "wx");
    const bool written = f != nullptr && std::fwrite(description.data(), 1, description.size(), f) == description.size() &&
                         std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
    if (f != nullptr) std::fclose(f);
    if (!written) {
      remove();
      return make_error(Errc::io_error, "cannot write " + (target / "backup.json").string());
    }
  }
  return out;
}

void NodeImpl::trim_state_streams(std::map<std::string, StateTrim>& trims) {
  std::map<std::string, StateTrim> seen;
  auto erase = [&](const StreamPtr& s, uint64_t before, StateTrim& t) {
    if (before <= t.erased_before) return;
    auto r = store::StreamLog::erase_before(*store_, s->meta().id, before);
    if (!r.ok()) {
      log_line(LogLevel::warn, "store", "trimming state stream '" + s->meta().name + "': " + r.error().message);
      return;
    }
    t.erased_before = before;
  };
  // A runner's own state stream: up to its last checkpoint taken.
  for (auto& q : checkpointed_runners()) {
    const StreamPtr& state = q->state_stream();
    if (!state || state->closed()) continue;
    StateTrim& t = seen[state->meta().name];
    if (auto it = trims.find(state->meta().name); it != trims.end()) t = it->second;
    uint64_t before = q->state_trim_before();
    // A follower that was away (killed, stopped, cut off) resumes its copy
    // after the last record it acknowledged: those stay until it has them,
    // as any stream's do, or it could never be in sync again.
    if (peering_) {
      if (auto need = peering_->retention_pin(state->meta().name)) before = std::min(before, *need);
    }
    erase(state, before, t);
  }
  // The state stream of a fragment hosted in another domain: no runner
  // here trims it; the relay appends the host's checkpoints and journal
  // to it (docs/cluster.md, "The hosted run").
  std::set<std::string> hosted;
  {
    std::lock_guard lock(hosted_mu_);
    for (const auto& [_, h] : hosted_) hosted.insert(h.meta.state_stream);
  }
  // It, and a follower's copy (@LEADER/QUERY--FRAGMENT--state): up to the
  // last checkpoint it holds whole, read as it grows (each record once).
  for (auto& s : list_streams()) {
    const StreamMeta& m = s->meta();
    const bool copy = m.producer == "import" && m.name.starts_with("@") && m.name.ends_with("--state");
    const bool relayed = hosted.count(m.name) != 0;
    if (s->closed() || (!copy && !relayed) || !(*m.schema == *state_stream_schema())) continue;
    StateTrim& t = seen[m.name];
    if (auto it = trims.find(m.name); it != trims.end()) t = it->second;
    Status failed = Status::Ok();
    for (;;) {
      std::vector<store::LogRecord> recs;
      failed = store::StreamLog::read(*store_, m.id, t.read_next, 16, 8u << 20, recs);
      if (!failed.ok() || recs.empty()) break;
      for (const auto& rec : recs) {
        failed = t.checkpoints.feed(rec);
        if (!failed.ok()) break;
        t.read_next = rec.last + 1;
      }
      if (!failed.ok()) break;
    }
    if (!failed.ok()) {
      log_line(LogLevel::warn, "store", "reading state stream copy '" + m.name + "': " + failed.error().message);
      continue;
    }
    uint64_t before = t.checkpoints.last_complete_first();
    // The relayed stream's own followers resume after what they acknowledged.
    if (relayed && peering_) {
      if (auto need = peering_->retention_pin(m.name)) before = std::min(before, *need);
    }
    erase(s, before, t);
  }
  trims = std::move(seen);  // forgets deleted queries and copies
}

void NodeImpl::enforce_retention() {
  for (auto& s : list_streams()) {
    if (s->closed()) continue;
    // The newest record stays (it carries the stream's next sequence number
    // across restarts), and so does everything a query may replay.
    auto last = store::StreamLog::last(*store_, s->meta().id);
    if (!last.ok() || !*last) continue;
    uint64_t pin = (*last)->first;
    // What importing domains have not acknowledged as stored.
    if (peering_) {
      if (auto need = peering_->retention_pin(s->meta().name)) pin = std::min(pin, *need);
    }
    for (auto& q : readers_of(s->meta().name)) {
      const auto& ins = q->meta().inputs;
      for (size_t i = 0; i < ins.size(); ++i)
        if (ins[i] == s->meta().name) pin = std::min(pin, q->pin(i));
    }
    const auto known = s->log_bytes();
    auto r = store::StreamLog::trim(*store_, s->meta().id, s->meta().retention, pin,
                                    wall_clock_ms(), known);
    if (!r.ok()) {
      log_line(LogLevel::warn, "store", "retention of stream '" + s->meta().name + "': " + r.error().message);
      continue;
    }
    if (s->meta().retention.max_bytes == 0) continue;
    if (known) {
      s->trimmed_log_bytes(r->bytes_removed);
    } else {
      s->set_log_bytes(r->bytes_retained);
    }
  }
}

Result<StreamPtr> NodeImpl::create_stream(StreamMeta meta) {
  std::unique_lock lock(catalog_mu_);
  if (streams_.count(meta.name))
    return make_error(Errc::already_exists, "stream '" + meta.name + "' exists");
  if (streams_.size() >= config_.max_streams)
    return make_error(Errc::limit_exceeded, "this node has " + std::to_string(streams_.size()) +
                                                " streams, its limit (limits.max_streams)");
  meta.id.value = allocate_id();
  meta.created_ms = wall_clock_ms();
  store::WriteBatch wb;
  wb.put(store::Cf::catalog, stream_key(meta.name), stream_meta_to_json(meta));
  std::string id;
  store::put_key_u64(id, next_id_);
  wb.put(store::Cf::meta, kNextIdKey, id);
  ENTENTE_RETURN_IF_ERROR(store_->write(wb, store::Durability::synced));
  auto s = std::make_shared<Stream>(std::move(meta), 1);
  s->tuples_in = &metrics_.counter("entente_stream_tuples_total", "Tuples appended to a stream",
                                   {{"stream", s->meta().name}});
  s->bytes_in = &metrics_.counter("entente_stream_bytes_total", "Encoded bytes appended to a stream",
                                  {{"stream", s->meta().name}});
  streams_[s->meta().name] = s;
  return s;
}

Status NodeImpl::delete_import(const std::string& name) {
  if (!peering_) return make_error(Errc::not_found, "no import of " + name + " (this node has no federation)");
  auto check = [&]() -> Status {
    auto it = streams_.find(name);
    if (it == streams_.end() || it->second->meta().producer != "import")
      return make_error(Errc::not_found, "no import of " + name);
    for (auto& [qn, q] : queries_)
      for (auto& in : q->meta().inputs)
        if (in == name)
          return make_error(Errc::conflict, "stream '" + name + "' is read by query '" + qn + "'; delete it first");
    return {};
  };
  {
    std::shared_lock lock(catalog_mu_);
    ENTENTE_RETURN_IF_ERROR(check());
  }
  // Outside the catalog lock: the peering takes its own locks, and an
  // import that is being opened takes the catalog lock under them.
  ENTENTE_RETURN_IF_ERROR(peering_->forget_import(name));
  StreamPtr s;
  {
    std::unique_lock lock(catalog_mu_);
    ENTENTE_RETURN_IF_ERROR(check());
    ENTENTE_RETURN_IF_ERROR(store_->erase(store::Cf::catalog, stream_key(name), store::Durability::synced));
    s = streams_[name];
    streams_.erase(name);
  }
  s->close();
  return store::StreamLog::drop(*store_, s->meta().id);
}

Result<StreamPtr> NodeImpl::adopt_replica(const std::string& mirror, StreamMeta meta) {
  StreamPtr old;
  {
    std::shared_lock lock(catalog_mu_);
    auto it = streams_.find(mirror);
    if (it == streams_.end() || it->second->meta().producer != "import")
      return make_error(Errc::not_found, "no copy '" + mirror + "' on this node");
    if (streams_.count(meta.name)) return make_error(Errc::already_exists, "stream '" + meta.name + "' exists");
    for (auto& [qn, q] : queries_)
      for (auto& in : q->meta().inputs)
        if (in == mirror)
          return make_error(Errc::conflict, "copy '" + mirror + "' is read by query '" + qn + "'");
    old = it->second;
  }
  // No append reaches the copy from now on; those it took land first.
  old->close();
  for (int i = 0; i < 500 && old->committed_next() != old->next_seq(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (old->committed_next() != old->next_seq())
    return make_error(Errc::unavailable, "copy '" + mirror + "' still has appends being written");
  // Its log stays where it is (by id); the catalog names it anew in one
  // atomic write, so a crash leaves either the copy or the stream.
  meta.id = old->meta().id;
  const uint64_t next = old->next_seq();
  std::vector<store::StreamLog::ProducerBatch> producers;
  ENTENTE_RETURN_IF_ERROR(store::StreamLog::producer_batches(*store_, meta.id, producers));
  auto s = std::make_shared<Stream>(meta, next);
  s->load_producers(std::move(producers));
  s->tuples_in = &metrics_.counter("entente_stream_tuples_total", "Tuples appended to a stream",
                                   {{"stream", meta.name}});
  s->bytes_in = &metrics_.counter("entente_stream_bytes_total", "Encoded bytes appended to a stream",
                                  {{"stream", meta.name}});
  {
    std::unique_lock lock(catalog_mu_);
    if (streams_.count(meta.name) || !streams_.count(mirror))
      return make_error(Errc::conflict, "stream '" + meta.name + "' or its copy changed meanwhile");
    store::WriteBatch wb;
    wb.put(store::Cf::catalog, stream_key(meta.name), stream_meta_to_json(meta));
    wb.erase(store::Cf::catalog, stream_key(mirror));
    wb.erase(store::Cf::catalog, "replica/" + mirror);
    ENTENTE_RETURN_IF_ERROR(store_->write(wb, store::Durability::synced));
    streams_.erase(mirror);
    streams_[meta.name] = s;
  }
  {
    std::lock_guard lock(replicas_mu_);
    replicas_.erase(mirror);
  }
  return s;
}

Status NodeImpl::delete_stream(const std::string& name, const std::string& moved_to) {
  StreamPtr s;
  {
    std::unique_lock lock(catalog_mu_);
    auto it = streams_.find(name);
    if (it == streams_.end()) return make_error(Errc::not_found, "no stream '" + name + "'");
    if (it->second->meta().producer == "import")
      return make_error(Errc::conflict, "stream '" + name + "' is imported from another domain; delete it with "
                                            "DELETE /v1/imports/" + name);
    if (it->second->meta().producer != "api")
      return make_error(Errc::conflict, "stream '" + name + "' is the output of " + it->second->meta().producer +
                                            "; delete the query instead");
    for (auto& [qn, q] : queries_)
      for (auto& in : q->meta().inputs)
        if (in == name)
          return make_error(Errc::conflict, "stream '" + name + "' is read by query '" + qn + "'; delete it first");
    ENTENTE_RETURN_IF_ERROR(store_->erase(store::Cf::catalog, stream_key(name), store::Durability::synced));
    s = it->second;
    streams_.erase(it);
  }
  if (moved_to.empty()) s->close();
  else s->close_moved(moved_to);
  return store::StreamLog::drop(*store_, s->meta().id);
}

StreamPtr NodeImpl::find_stream(const std::string& name) const {
  std::shared_lock lock(catalog_mu_);
  auto it = streams_.find(name);
  return it == streams_.end() ? nullptr : it->second;
}

std::vector<StreamPtr> NodeImpl::list_streams() const {
  std::shared_lock lock(catalog_mu_);
  std::vector<StreamPtr> out;
  for (auto& [_, s] : streams_) out.push_back(s);
  return out;
}

Result<std::shared_ptr<QueryRunner>> NodeImpl::deploy_query(std::string_view network_json, Diagnostics& diag,
                                                            const FragmentOf* fragment, const QueryOptions* options) {
  auto net = engine::QueryNetwork::parse(network_json, diag);
  if (!net.ok()) return make_error(Errc::invalid_argument, "the query network is invalid");
  std::unique_lock lock(catalog_mu_);
  const std::string name = net->name();
  if (queries_.count(name)) return make_error(Errc::already_exists, "query '" + name + "' exists");
  if (queries_.size() >= config_.max_queries)
    return make_error(Errc::limit_exceeded, "this node runs " + std::to_string(queries_.size()) +
                                                " queries, its limit (limits.max_queries)");
  QueryMeta meta;
  meta.name = name;
  meta.network_json = std::string(network_json);
  if (fragment) {
    meta.query = fragment->query;
    meta.fragment = fragment->fragment;
  } else if (name.find("--") != std::string::npos) {
    diag.error("$.name", "'--' is reserved for the fragments of a query cut across nodes");
  }
  std::vector<StreamPtr> ins, outs;
  std::string start_conflict;  // a "start_from" outside a stream's log
  for (size_t i = 0; i < net->inputs().size(); ++i) {
    const auto& in = net->inputs()[i];
    const std::string path = "$.inputs[" + std::to_string(i) + "]";
    if (fragment && fragment->reads.count(in.name)) {
      // An internal stream: read from its first tuple, with the watermark
      // its rows carry.
      const std::string& local = fragment->reads.at(in.name);
      auto it = streams_.find(local);
      if (it == streams_.end()) {
        diag.error(path + ".name", "internal stream '" + in.name + "' is not on this node (as '" + local + "')");
        continue;
      }
      if (!(*it->second->meta().schema == *engine::internal_stream_schema(*in.schema)))
        diag.error(path + ".schema", "does not match internal stream '" + local + "', whose schema is " +
                                         it->second->meta().schema->to_string());
      meta.internal_inputs.push_back(static_cast<uint32_t>(ins.size()));
      ins.push_back(it->second);
      meta.inputs.push_back(local);
      meta.start.push_back(1);
      continue;
    }
    // The stream the input reads: its name, or "stream" (a stream of this
    // domain named DOMAIN/NAME is the local NAME).
    std::string stream_name = in.stream.empty() ? in.name : in.stream;
    if (in.stream.rfind(config_.domain + "/", 0) == 0) stream_name = in.stream.substr(config_.domain.size() + 1);
    const std::string where = in.stream.empty() ? path + ".name" : path + ".stream";
    auto it = streams_.find(stream_name);
    if (it == streams_.end()) {
      diag.error(where, "no stream '" + stream_name + "' on this node" +
                            (stream_name.find('/') != std::string::npos && !peering_
                                 ? std::string(" (importing another domain's stream needs a federation section)")
                                 : std::string()));
      continue;
    }
    if (!(*it->second->meta().schema == *in.schema))
      diag.error(path + ".schema", "does not match stream '" + stream_name + "', " +
                                       schema_difference(*in.schema, *it->second->meta().schema));
    ins.push_back(it->second);
    meta.inputs.push_back(stream_name);
    meta.start.push_back(start_position(in, *it->second, options, start_conflict));
  }
  check_start_names(*net, options, diag);
  // Made by a split: its inputs continue where the split fragment stood.
  const FragmentOf::Seed* seed = fragment ? fragment->seed.get() : nullptr;
  if (seed && seed->state.positions.size() == meta.start.size()) meta.start = seed->state.positions;
  std::map<size_t, StreamPtr> adopted;  // by output index (seed->adopt)
  // An output named like an existing stream is a conflict with the node's
  // state (409, like creating that stream), not an invalid network: it is
  // answered once the network is otherwise valid.
  std::string taken;
  // A fragment taking over from a node that died finds its streams here.
  const bool takeover = fragment && fragment->takeover;
  // A warm standby reads this node's follower copies of them instead.
  const bool standby = fragment && fragment->standby;
  std::string missing;
  auto adopt = [&](const std::string& stream, const std::string& what) -> StreamPtr {
    auto copy = standby ? fragment->copies.find(stream) : fragment->copies.end();
    auto it = streams_.find(standby ? (copy == fragment->copies.end() ? std::string() : copy->second) : stream);
    // (A follower's copy is written by the copying, "import".)
    if (it == streams_.end() || (!standby && it->second->meta().producer != "query:" + fragment->query)) {
      if (missing.empty())
        missing = std::string(standby ? "warming a standby of" : "taking") + " fragment '" + name + "'" +
                  (standby ? "" : " over") + ": its " + what + " '" + stream + "' is not on this node" +
                  (standby ? std::string(" as a follower's copy") : std::string()) +
                  (it == streams_.end() ? std::string() : " as written by query '" + fragment->query + "'");
      return nullptr;
    }
    return it->second;
  };
  for (size_t o = 0; o < net->outputs().size(); ++o) {
    const auto& out = net->outputs()[o];
    const std::string path = "$.outputs[" + std::to_string(o) + "].name";
    const bool internal = fragment && fragment->writes.count(out.name);
    if (internal) meta.internal_outputs.push_back(static_cast<uint32_t>(o));
    if (takeover || standby) {
      if (auto s = adopt(out.name, "output")) outs.push_back(s);
    } else if (seed && seed->adopt.count(out.name)) {
      // One writer at a time: the fragment split (or merged back) stopped.
      for (const auto& [other, q] : queries_)
        for (const auto& written : q->meta().outputs)
          if (written == out.name && taken.empty()) taken = path + ": query '" + other + "' writes '" + out.name + "'";
      if (auto s = adopt(out.name, "output")) adopted[o] = s;
    } else if (internal) {
      if (streams_.count(out.name) && taken.empty()) taken = path + ": stream '" + out.name + "' exists already";
    } else if (Status s = check_stream_name(out.name); !s.ok()) diag.error(path, s.error().message);
    else if (streams_.count(out.name) && taken.empty()) taken = path + ": stream '" + out.name + "' exists already";
    meta.outputs.push_back(out.name);
  }
  // A fragment's journal and checkpoints go to its state stream
  // (docs/cluster.md, "A fragment's state stream"); a whole query keeps
  // them in the store.
  StreamPtr state;
  if (fragment) {
    meta.state_stream = state_stream_name(name);
    if (takeover || standby) state = adopt(meta.state_stream, "state stream");
    else if (streams_.count(meta.state_stream) && taken.empty())
      taken = "stream '" + meta.state_stream + "' (the fragment's state stream) exists already";
  }
  if (!diag.ok()) return make_error(Errc::invalid_argument, "the query network does not fit this node");
  if (!start_conflict.empty()) return make_error(Errc::conflict, start_conflict);
  if (!missing.empty()) return make_error(Errc::not_found, missing);
  if (!taken.empty()) return make_error(Errc::already_exists, taken);
  const size_t new_streams = takeover || standby ? 0 : net->outputs().size() + (fragment ? 1 : 0);
  if (streams_.size() + new_streams > config_.max_streams)
    return make_error(Errc::limit_exceeded, "$.outputs: would exceed this node's stream limit (limits.max_streams, " +
                                                std::to_string(config_.max_streams) + ")");

  meta.id = allocate_id();
  meta.created_ms = wall_clock_ms();
  store::WriteBatch wb;
  auto add_stream = [&](StreamMeta sm) {
    wb.put(store::Cf::catalog, stream_key(sm.name), stream_meta_to_json(sm));
    return new_output_stream(std::move(sm));
  };
  if (standby) {
    // Nothing of it is written or registered: it warms until a take-over
    // promotes it (or it is dropped).
    ENTENTE_ASSIGN_OR_RETURN(auto runner, QueryRunner::create(meta, ins, outs, runner_env(), state));
    runner->begin_warm();
    return runner;
  }
  for (size_t o = 0; o < net->outputs().size() && !takeover; ++o) {
    if (auto a = adopted.find(o); a != adopted.end()) {
      outs.push_back(a->second);
      continue;
    }
    StreamMeta sm;
    sm.name = net->outputs()[o].name;
    sm.id.value = allocate_id();
    const bool internal = std::find(meta.internal_outputs.begin(), meta.internal_outputs.end(), o) !=
                          meta.internal_outputs.end();
    sm.schema = internal ? engine::internal_stream_schema(*net->outputs()[o].schema) : net->outputs()[o].schema;
    sm.producer = "query:" + (fragment ? fragment->query : name);
    sm.retention = {config_.retention.max_tuples, config_.retention.max_bytes, config_.retention.max_age_ms};
    sm.created_ms = meta.created_ms;
    outs.push_back(add_stream(std::move(sm)));
  }
  if (fragment && !takeover) {
    // Hidden ('--'), written by the query; no retention of its own: the
    // runner's checkpoints say what it no longer needs (trim_state_streams).
    StreamMeta sm;
    sm.name = meta.state_stream;
    sm.id.value = allocate_id();
    sm.schema = state_stream_schema();
    sm.producer = "query:" + fragment->query;
    sm.created_ms = meta.created_ms;
    state = add_stream(std::move(sm));
  }
  ENTENTE_ASSIGN_OR_RETURN(auto runner, QueryRunner::create(meta, ins, outs, runner_env(), state));
  if (seed) ENTENTE_RETURN_IF_ERROR(runner->seed(seed->state));
  if (takeover && !fragment->warm) {
    // Recovered outside the catalog lock: a large checkpoint restores for
    // seconds (100 MB: about 6 s on the test machine), and every API call,
    // peer link and membership callback of this node takes that lock (a
    // node that held it through such a take-over lost its etcd lease).
    // Its streams are this node's already (a take-over creates none).
    lock.unlock();
    Status recovered = runner->recover();
    lock.lock();
    if (!recovered.ok())
      return make_error(recovered.error().code, "taking fragment '" + name + "' over: " + recovered.error().message);
    if (queries_.count(name)) return make_error(Errc::already_exists, "query '" + name + "' exists");
    std::vector<StreamPtr> written = outs;
    if (state) written.push_back(state);
    for (const auto& s : written)
      if (auto it = streams_.find(s->meta().name); it == streams_.end() || it->second != s)
        return make_error(Errc::conflict, "stream '" + s->meta().name + "' of query '" + name +
                                              "' was deleted while the query was taken over");
  } else if (takeover) {
    // The standby replays the last few journal entries only.
    ENTENTE_ASSIGN_OR_RETURN(runner, take_over_runner(*fragment, runner, ins, outs, state));
  }
  // Its query is stopped, or it is the new network of a query being
  // replaced: it consumes nothing until started.
  const bool held = fragment && fragment->held;
  if ((takeover && fragment->stopped) || held) {
    meta.stopped = true;
    runner->keep_stopped();
  }
  wb.put(store::Cf::catalog, query_key(name), query_meta_to_json(meta));
  std::string id;
  store::put_key_u64(id, next_id_);
  wb.put(store::Cf::meta, kNextIdKey, id);
  ENTENTE_RETURN_IF_ERROR(store_->write(wb, store::Durability::synced));
  if (!takeover) {
    for (auto& s : outs) streams_[s->meta().name] = s;
    if (state) streams_[state->meta().name] = state;
  }
  queries_[name] = runner;
  if (held) {
    // Its first checkpoint (the seed) in its state stream, held by the
    // followers, before the query's entry names it (cluster_replace.cpp).
    lock.unlock();
    if (auto cp = runner->pause(); !cp.ok())
      return make_error(cp.error().code, "checkpointing the new network of query '" + fragment->query + "': " +
                                              cp.error().message);
    return runner;
  }
  runner->start();
  lock.unlock();
  // A first checkpoint at once: the state stream then always holds one
  // (and the inputs' start positions with it) for a node taking over.
  // Outside the catalog lock: it waits for the state stream's followers.
  if (state && !takeover) runner->request_checkpoint([](const Result<CheckpointInfo>&) {});
  return runner;
}

Result<std::shared_ptr<QueryRunner>> NodeImpl::take_over_runner(const FragmentOf& fragment,
                                                                std::shared_ptr<QueryRunner> fresh,
                                                                const std::vector<StreamPtr>& ins,
                                                                const std::vector<StreamPtr>& outs, StreamPtr state) {
  const std::string& name = fresh->meta().name;
  if (fragment.warm) {
    // Moved here on request: the standby that warmed over the same logs
    // replays the last few journal entries and continues.
    Status s = fragment.warm->promote(ins, outs, state);
    metrics_
        .counter("entente_fragment_standbys_total",
                 "Fragments moved here on request, by whether their warm standby continued (promoted) or they "
                 "recovered from the checkpoint after all (fell_back)",
                 {{"query", fragment.query}, {"outcome", s.ok() ? "promoted" : "fell_back"}})
        .inc();
    if (s.ok()) return fragment.warm;
    base::logf(LogLevel::warn, "cluster", "fragment '%s': its warm standby cannot continue (%s); it recovers from its "
                         "checkpoint and journal\n", name.c_str(), s.error().message.c_str());
  }
  // The restart path, on this node: the last checkpoint and the journal
  // from the state stream copy, replayed before anything new.
  Status s = fresh->recover();
  if (!s.ok()) return make_error(s.error().code, "taking fragment '" + name + "' over: " + s.error().message);
  return fresh;
}

Status NodeImpl::delete_query(const std::string& name) {
  std::lock_guard life(lifecycle_mu_);  // not while it is stopped, started or replaced
  std::shared_ptr<QueryRunner> q;
  std::vector<StreamPtr> outs;
  {
    std::unique_lock lock(catalog_mu_);
    auto it = queries_.find(name);
    if (it == queries_.end()) return make_error(Errc::not_found, "no query '" + name + "'");
    q = it->second;
    for (auto& [other_name, other] : queries_) {
      if (other_name == name) continue;
      for (auto& in : other->meta().inputs)
        for (auto& o : q->meta().outputs)
          if (in == o)
            return make_error(Errc::conflict, "query '" + other_name + "' reads '" + o + "', an output of '" + name +
                                                  "'; delete it first");
    }
    store::WriteBatch wb;
    wb.erase(store::Cf::catalog, query_key(name));
    // The outputs, and a fragment's state stream with them.
    std::vector<std::string> owned = q->meta().outputs;
    if (!q->meta().state_stream.empty()) owned.push_back(q->meta().state_stream);
    for (auto& o : owned) {
      wb.erase(store::Cf::catalog, stream_key(o));
      if (auto s = streams_.find(o); s != streams_.end()) outs.push_back(s->second);
    }
    QueryRunner::add_erase_state(wb, q->meta());
    ENTENTE_RETURN_IF_ERROR(store_->write(wb, store::Durability::synced));
    queries_.erase(it);
    for (auto& o : owned) streams_.erase(o);
  }
  q->stop();
  for (auto& s : outs) {
    s->close();
    ENTENTE_RETURN_IF_ERROR(store::StreamLog::drop(*store_, s->meta().id));
  }
  return Status::Ok();
}

std::shared_ptr<QueryRunner> NodeImpl::find_query(const std::string& name) const {
  std::shared_lock lock(catalog_mu_);
  auto it = queries_.find(name);
  return it == queries_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<QueryRunner>> NodeImpl::list_queries() const {
  std::shared_lock lock(catalog_mu_);
  std::vector<std::shared_ptr<QueryRunner>> out;
  for (auto& [_, q] : queries_) out.push_back(q);
  return out;
}

std::vector<std::shared_ptr<QueryRunner>> NodeImpl::readers_of(const std::string& stream) const {
  std::shared_lock lock(catalog_mu_);
  std::vector<std::shared_ptr<QueryRunner>> out;
  for (auto& [_, q] : queries_)
    for (auto& in : q->meta().inputs)
      if (in == stream) {
        out.push_back(q);
        break;
      }
  return out;
}

void NodeImpl::checkpoint_all(std::function<void(std::vector<Result<CheckpointInfo>>)> done) {
  auto queries = list_queries();
  struct State {
    std::mutex mu;
    std::vector<Result<CheckpointInfo>> results;
    size_t remaining;
    std::function<void(std::vector<Result<CheckpointInfo>>)> done;
  };
  auto st = std::make_shared<State>();
  st->remaining = queries.size();
  if (process_durability(config_)) {
    // The answer says the checkpoints are durable: with the group commit not
    // syncing, sync the WAL first. This blocks the committer thread for one
    // fsync, which is acceptable for an explicit (administrator's) request.
    st->done = [this, done = std::move(done)](std::vector<Result<CheckpointInfo>> results) {
      sync_wal(*store_, "checkpoints");
      done(std::move(results));
    };
  } else {
    st->done = std::move(done);
  }
  if (queries.empty()) {
    st->done({});
    return;
  }
  for (auto& q : queries) {
    q->request_checkpoint([st](const Result<CheckpointInfo>& r) {
      std::unique_lock lock(st->mu);
      st->results.push_back(r);
      if (--st->remaining == 0) {
        auto results = std::move(st->results);
        lock.unlock();
        st->done(std::move(results));
      }
    });
  }
}

void NodeImpl::register_collectors() {
  metrics_.add_collector([this](MetricsWriter& w) {
    for (auto& s : list_streams()) {
      w.gauge("entente_stream_next_seq", "Next sequence number of a stream its readers see",
              {{"stream", s->meta().name}}, static_cast<double>(s->visible_next()));
      w.gauge("entente_stream_durable_next_seq",
              "Next sequence number of a stream past what this node's log holds (ahead of "
              "entente_stream_next_seq while its in-sync followers have not acknowledged the rest)",
              {{"stream", s->meta().name}}, static_cast<double>(s->committed_next()));
    }
    for (auto& q : list_queries()) {
      auto info = q->info();
      const std::string& qn = q->meta().name;
      w.gauge("entente_query_lag_tuples", "Committed input tuples a query has not processed yet", {{"query", qn}},
              static_cast<double>(info.lag_tuples));
      w.gauge("entente_query_running", "1 when the query runs, 0 when it failed or was stopped", {{"query", qn}},
              info.state == "running" ? 1 : 0);
      // A stop is an administrator's choice, not a failure to alert on.
      w.gauge("entente_query_stopped", "1 when the query was stopped (POST /v1/queries/{name}/stop)",
              {{"query", qn}}, info.state == "stopped" ? 1 : 0);
      w.counter("entente_query_cpu_seconds_total", "CPU time a query (or fragment) runner spent on this node",
                {{"query", qn}}, info.cpu_seconds);
      w.gauge("entente_query_load_cpu_ms_per_s",
              "A query (or fragment) runner's CPU milliseconds per second over the last 10 s", {{"query", qn}},
              info.cpu_ms_per_s);
      for (auto& b : info.boxes) {
        Labels l{{"query", qn}, {"box", b.id}, {"type", b.type}};
        w.counter("entente_box_tuples_in_total", "Tuples into a box", l, static_cast<double>(b.stats.tuples_in));
        w.counter("entente_box_tuples_out_total", "Tuples out of a box", l, static_cast<double>(b.stats.tuples_out));
        w.counter("entente_box_bytes_out_total", "Bytes out of a box", l, static_cast<double>(b.stats.bytes_out));
        w.counter("entente_box_cpu_seconds_total", "CPU time spent in a box", l,
                  static_cast<double>(b.stats.cpu_ns) / 1e9);
      }
    }
    auto g = gc_->stats();
    w.gauge("entente_ingest_queue_bytes", "Bytes waiting for the group commit", {},
            static_cast<double>(g.pending_bytes));
    w.counter("entente_group_commits_total",
              "Group commits: RocksDB writes of queued ingest (one fsync each with ingest_durability fsync)", {},
              static_cast<double>(g.groups));
    w.counter("entente_group_commit_syncs_total",
              "Group commits that were synced (an fsync of the write-ahead log): every one with ingest_durability "
              "fsync, and those holding a batch of a stream whose durability is fsync",
              {}, static_cast<double>(g.synced_groups));
    w.gauge("entente_ingest_durability",
            "1 for the configured ingest_durability mode (fsync: acks after fsync; process: acks after the WAL "
            "write)",
            {{"mode", std::string(ingest_durability_name(config_.ingest_durability))}}, 1);
    w.counter("entente_ingest_rejected_total", "Submissions refused because the queue was full", {},
              static_cast<double>(g.rejected));
    if (server_) {
      auto ss = server_->stats();
      w.gauge("entente_api_connections", "Open API connections", {}, static_cast<double>(ss.connections_open));
      w.gauge("entente_api_websockets", "Open WebSockets", {}, static_cast<double>(ss.websockets_open));
      w.counter("entente_api_connections_refused_total", "Connections refused over limits.max_connections", {},
                static_cast<double>(ss.connections_refused));
      w.counter("entente_api_connections_refused_per_address_total",
                "Connections refused over limits.max_connections_per_address", {},
                static_cast<double>(ss.connections_refused_per_address));
      w.counter("entente_api_handshake_timeouts_total",
                "Connections closed for no TLS handshake and first request header within limits.handshake_timeout",
                {}, static_cast<double>(ss.handshake_timeouts));
      w.counter("entente_api_bad_requests_total", "Malformed or over-limit requests", {},
                static_cast<double>(ss.bad_requests));
      w.counter("entente_api_tls_handshake_failures_total", "Failed TLS handshakes", {},
                static_cast<double>(ss.tls_handshake_failures));
    }
  });
}

}  // namespace detail

Node::Node(std::unique_ptr<detail::NodeImpl> impl) : impl_(std::move(impl)) {}
Node::~Node() = default;

Result<std::unique_ptr<Node>> Node::open(NodeConfig config) {
  auto impl = std::make_unique<detail::NodeImpl>(std::move(config));
  ENTENTE_RETURN_IF_ERROR(impl->open());
  return std::unique_ptr<Node>(new Node(std::move(impl)));
}

Status Node::start() { return impl_->start(); }
Status Node::reload(NodeConfig config, std::vector<std::string>& changes, std::vector<std::string>& kept) {
  return impl_->reload(std::move(config), changes, kept);
}
uint16_t Node::api_port() const { return impl_->port(); }
void Node::stop() { impl_->stop(); }

}  // namespace entente::broker
