// WebSocket endpoints: subscribe (follow a stream from a sequence number)
// and publish (a sustained feed of tuples with ordered acknowledgements).
// Close codes are documented in docs/api.md.
#include <charconv>
#include <deque>
#include <numeric>

#include "broker/detail/ingest.h"
#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "federation/peering.h"
#include "engine/codec.h"
#include "store/stream_log.h"

namespace entente::broker::detail {

std::string routing_path(const http::Request& req);  // api.cpp

namespace {

constexpr uint16_t kCloseSlowConsumer = 4001;
constexpr uint16_t kCloseFeedEnded = 4003;
constexpr uint16_t kCloseStreamDeleted = 4004;
constexpr uint16_t kCloseStreamMoved = 4010;
constexpr uint16_t kCloseTooOld = 4008;
constexpr uint16_t kCloseInternal = 1011;
constexpr size_t kCatchupRecords = 16;
constexpr size_t kCatchupBytes = 4u << 20;
constexpr size_t kPublishWindow = 64;  // unacknowledged messages before reading pauses

enum class Format : uint8_t { json, binary };

// A WebSocket close reason is at most 123 bytes (RFC 6455 §5.5).
constexpr size_t kMaxCloseReason = 123;

// "<cause>; from=<next>", the cause cut (at a character boundary, marked
// with "…") so that the resume point always fits.
std::string feed_ended_reason(const std::string& cause, uint64_t next) {
  const std::string tail = "; from=" + std::to_string(next);
  std::string head = cause;
  if (head.size() + tail.size() > kMaxCloseReason) {
    size_t keep = kMaxCloseReason - tail.size() - 3;  // room for "…" (3 bytes)
    while (keep > 0 && (static_cast<unsigned char>(head[keep]) & 0xC0) == 0x80) --keep;
    head.resize(keep);
    head += "\xE2\x80\xA6";
  }
  return head + tail;
}

// Follows one stream for one WebSocket. Catch-up reads the log while the
// socket's send queue has room (paced by on_drain); once it reaches the
// committed head it switches to live records from the stream's tap.
//
// Threading: pump() runs on the connection's strand (on_open, on_drain);
// on_record on the group-commit thread; mu_ serializes them.
class Subscriber final : public http::WebSocketSession,
                         public Tap,
                         public std::enable_shared_from_this<Subscriber> {
 public:
  Subscriber(NodeImpl& node, StreamPtr stream, uint64_t from, Format format)
      : node_(node), stream_(std::move(stream)), next_(from), format_(format),
        half_buffer_(node.config().limits.ws_send_buffer_bytes / 2) {}

  void on_open(std::shared_ptr<http::WebSocket> ws) override {
    {
      std::lock_guard lock(mu_);
      ws_ = ws;
    }
    std::weak_ptr<Subscriber> weak = shared_from_this();
    ws->set_on_drain([weak] {
      if (auto s = weak.lock()) s->pump();
    });
    stream_->add_tap(shared_from_this());
    pump();
  }

  bool on_message(std::string_view, bool) override { return true; }  // subscribers only listen

  void on_close() override {
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      ws_.reset();
    }
    stream_->remove_tap(this);
  }

  void on_record(const RecordPtr& rec) override {
    std::lock_guard lock(mu_);
    if (closed_ || !live_ || rec->last < next_) return;
    if (rec->first > next_) {
      // Cannot happen with in-order publication; recover through the log.
      live_ = false;
      return;
    }
    std::string frame;
    if (format_ == Format::binary) {
      if (rec->first == next_) frame = *rec->encoded;
      else encode_slice(*rec->batch, next_ - rec->first, frame);
    } else {
      if (rec->first == next_) frame = rec->ndjson();
      else render_slice(*rec->batch, next_ - rec->first, frame);
    }
    send_locked(std::move(frame), rec->last + 1);
  }

  void on_stream_closed() override {
    std::lock_guard lock(mu_);
    // Led by another node now (a move or a failover): the subscriber
    // resumes where it stopped, through any node. Within the close
    // reason's 123 bytes.
    if (const std::string to = stream_->moved_to(); !to.empty()) {
      close_locked(kCloseStreamMoved, "led by " + to.substr(0, 64) + " now; resume with from=" + std::to_string(next_));
      return;
    }
    close_locked(kCloseStreamDeleted, "stream '" + stream_->meta().name + "' was deleted");
  }

  // An imported stream's owner refused or ended the import (its contract
  // was revoked or expired): why and where to resume, first, within the
  // close reason's 123 bytes ("revoked c-… by acme; from=23910"). The whole
  // text is what the next subscription attempt is answered (upgrade).
  void on_feed_ended(const std::string& cause, const std::string& reason) override {
    (void)reason;
    std::lock_guard lock(mu_);
    close_locked(kCloseFeedEnded, feed_ended_reason(cause, next_));
  }

 private:
  static void encode_slice(const engine::Batch& b, size_t offset, std::string& out) {
    std::vector<uint32_t> rows(b.rows() - offset);
    std::iota(rows.begin(), rows.end(), static_cast<uint32_t>(offset));
    engine::encode_batch(b.take(rows), out);
  }
  static void render_slice(const engine::Batch& b, size_t offset, std::string& out) {
    for (size_t r = offset; r < b.rows(); ++r) {
      engine::row_to_json(b, r, out);
      out += '\n';
    }
  }

  // REQUIRES: mu_ held.
  void close_locked(uint16_t code, std::string reason) {
    if (closed_) return;
    closed_ = true;
    if (ws_) ws_->close(code, std::move(reason));
  }

  // REQUIRES: mu_ held. Sends one frame that ends before `new_next`.
  bool send_locked(std::string frame, uint64_t new_next) {
    if (!ws_) return false;
    auto r = ws_->send(std::move(frame), format_ == Format::binary);
    if (r == http::WebSocket::SendResult::overflow) {
      close_locked(kCloseSlowConsumer, "slow consumer: send buffer full; resume with from=" + std::to_string(next_));
      return false;
    }
    if (r == http::WebSocket::SendResult::closed) {
      closed_ = true;
      return false;
    }
    next_ = new_next;
    return true;
  }

  // Catch-up from the log, bounded by the send buffer.
  void pump() {
    std::lock_guard lock(mu_);
    while (!closed_ && !live_ && ws_) {
      if (ws_->queued_bytes() > half_buffer_) return;  // on_drain calls again
      if (next_ >= stream_->visible_next()) {
        // Records committed after this point reach on_record, which runs
        // after the head moved and needs mu_: none is missed.
        live_ = true;
        return;
      }
      std::vector<store::LogRecord> recs;
      Status s = store::StreamLog::read(node_.store(), stream_->meta().id, next_, kCatchupRecords, kCatchupBytes, recs);
      if (!s.ok()) {
        close_locked(kCloseInternal, "reading the stream's log failed");
        return;
      }
      if (recs.empty() || recs.front().first > next_) {
        const uint64_t first = recs.empty() ? stream_->visible_next() : recs.front().first;
        close_locked(kCloseTooOld, "from=" + std::to_string(next_) + " is older than the oldest retained tuple " +
                                       std::to_string(first) + "; resume with from=" + std::to_string(first));
        return;
      }
      for (auto& rec : recs) {
        if (rec.first > next_ || rec.last >= stream_->visible_next()) break;
        // Each record, not only each read, waits for room: records of a
        // query's output can be large (up to 8192 rows each).
        if (ws_->queued_bytes() > half_buffer_) return;  // on_drain calls again
        std::string frame;
        if (rec.first == next_ && format_ == Format::binary) {
          frame = std::move(rec.payload);
        } else {
          std::string_view in = rec.payload;
          auto b = engine::decode_batch(in);
          if (!b.ok()) {
            close_locked(kCloseInternal, "the stream's log is corrupt");
            return;
          }
          if (format_ == Format::binary) encode_slice(*b, next_ - rec.first, frame);
          else render_slice(*b, next_ - rec.first, frame);
        }
        if (!send_locked(std::move(frame), rec.last + 1)) return;
      }
    }
  }

  NodeImpl& node_;
  StreamPtr stream_;
  std::mutex mu_;
  std::shared_ptr<http::WebSocket> ws_;  // REQUIRES: mu_
  uint64_t next_;                        // REQUIRES: mu_; next seq to send
  bool live_ = false;                    // REQUIRES: mu_
  bool closed_ = false;                  // REQUIRES: mu_
  Format format_;
  size_t half_buffer_;
};

// One publisher's feed. Each message is ingested as one batch; the answers
// go back in message order, whatever order ingest finishes in. A producer
// named on the upgrade numbers its messages implicitly: the first is
// `producer_.seq`, each next one the number after (docs/api.md).
class Publisher final : public http::WebSocketSession, public std::enable_shared_from_this<Publisher> {
 public:
  Publisher(NodeImpl& node, StreamPtr stream, std::optional<ProducerTag> producer)
      : node_(node), stream_(std::move(stream)), producer_(std::move(producer)) {}

  void on_open(std::shared_ptr<http::WebSocket> ws) override {
    std::lock_guard lock(mu_);
    ws_ = std::move(ws);
  }

  bool on_message(std::string_view data, bool binary) override {
    uint64_t index;
    {
      std::lock_guard lock(mu_);
      index = next_index_++;
      answers_.emplace_back();
    }
    IngestFormat format = IngestFormat::binary;
    if (!binary) {
      size_t i = 0;
      while (i < data.size() && std::isspace(static_cast<unsigned char>(data[i]))) ++i;
      format = i < data.size() && data[i] == '[' ? IngestFormat::json_array : IngestFormat::ndjson;
    }
    std::optional<ProducerTag> tag = producer_;
    if (tag) tag->seq += index;  // wraps only after 2^64 messages
    std::weak_ptr<Publisher> weak = shared_from_this();
    ingest(node_, stream_, format, std::string(data), tag, [weak, index, tag](IngestResult r) {
      auto self = weak.lock();
      if (!self) return;
      JsonOut j;
      j.begin_object();
      if (r.problem) {
        j.key("error").raw(r.problem->body);
      } else {
        j.key("ack").raw(ingest_answer_json(r, tag));
      }
      j.end_object();
      self->answer(index, j.take());
    });
    std::lock_guard lock(mu_);
    if (answers_.size() >= kPublishWindow) {
      paused_ = true;
      return false;
    }
    return true;
  }

  void on_close() override {
    std::lock_guard lock(mu_);
    ws_.reset();
  }

 private:
  void answer(uint64_t index, std::string text) {
    std::lock_guard lock(mu_);
    answers_[index - first_index_] = std::move(text);
    while (!answers_.empty() && answers_.front()) {
      if (ws_) ws_->send(std::move(*answers_.front()), false);
      answers_.pop_front();
      ++first_index_;
    }
    if (paused_ && answers_.size() < kPublishWindow / 2 && ws_) {
      paused_ = false;
      ws_->resume_reading();
    }
  }

  NodeImpl& node_;
  StreamPtr stream_;
  const std::optional<ProducerTag> producer_;      // the first message's name
  std::mutex mu_;
  std::shared_ptr<http::WebSocket> ws_;            // REQUIRES: mu_
  std::deque<std::optional<std::string>> answers_;  // REQUIRES: mu_
  uint64_t first_index_ = 0;                        // REQUIRES: mu_
  uint64_t next_index_ = 0;                         // REQUIRES: mu_
  bool paused_ = false;                             // REQUIRES: mu_
};

}  // namespace

std::shared_ptr<http::WebSocketSession> NodeImpl::upgrade(const http::Request& req, http::Response& reject) {
  // The route and the role it needs come from the API's table (api_routes).
  PathParams params;
  const auto routes = match_routes(routing_path(req), params);
  if (routes.empty() || !routes.front()->websocket || !routes.front()->role) {
    reject = http::Response::problem(404, "Not Found", "no WebSocket endpoint at " + req.path.substr(0, 200));
    return nullptr;
  }
  // A browser's token comes in a subprotocol or a session cookie (ui.cpp):
  // as an Authorization header from here on, also when relayed.
  http::Request with_bearer = req;
  if (auto p = browser_bearer(with_bearer, *routes.front())) {
    reject = std::move(*p);
    return nullptr;
  }
  if (std::string_view(routes.front()->path) == "/v1/ui/live") {
    auto auth = authenticate(with_bearer, *routes.front()->role);
    if (!auth.ok) {
      reject = std::move(auth.problem);
      return nullptr;
    }
    return ui_live_.open(std::string(with_bearer.header("authorization").value_or("")), req.remote, reject);
  }
  const std::string param = params.at(0);
  const bool subscribe = std::string_view(routes.front()->path) == "/v1/streams/{name}/subscribe";
  return upgrade_authorised(with_bearer, *routes.front(), param, subscribe, reject);
}

std::shared_ptr<http::WebSocketSession> NodeImpl::upgrade_authorised(const http::Request& req, const RouteInfo& route,
                                                                     const std::string& param, bool subscribe,
                                                                     http::Response& reject) {
  auto auth = authenticate(req, *route.role);
  if (!auth.ok) {
    reject = std::move(auth.problem);
    return nullptr;
  }
  // A stream another node of the domain leads: the session is relayed
  // there (docs/cluster.md).
  if (auto leader = stream_leader(param); leader && *leader != config_.node) {
    return forward_websocket(req, *leader, reject);
  }
  if (Status unknown = catalog_not_read(param); !unknown.ok()) {
    reject = problem_for(unknown.error());
    return nullptr;
  }
  auto stream = find_stream(param);
  if (!stream) {
    reject = http::Response::problem(404, "Not Found", "no stream '" + param.substr(0, 100) + "'");
    return nullptr;
  }
  if (!subscribe) {
    if (stream->meta().producer != "api") {
      reject = http::Response::problem(409, "Conflict", "stream '" + param + "' is written by " +
                                                            stream->meta().producer + "; it takes no tuples from publishers");
      return nullptr;
    }
    auto producer = producer_of(req);
    if (!producer.ok()) {
      reject = http::Response::problem(400, "Bad Request", producer.error().message);
      return nullptr;
    }
    return std::make_shared<Publisher>(*this, stream, std::move(*producer));
  }
  Format format = Format::json;
  if (auto f = req.param("format")) {
    if (*f == "binary") format = Format::binary;
    else if (*f != "json") {
      reject = http::Response::problem(400, "Bad Request", "format must be json or binary");
      return nullptr;
    }
  }
  uint64_t from = stream->visible_next();
  if (auto f = req.param("from")) {
    uint64_t v = 0;
    auto [p, ec] = std::from_chars(f->data(), f->data() + f->size(), v);
    if (ec != std::errc() || p != f->data() + f->size()) {
      reject = http::Response::problem(400, "Bad Request", "from must be a sequence number (0 = oldest retained)");
      return nullptr;
    }
    if (v == 0) {
      auto first = store::StreamLog::first(*store_, stream->meta().id);
      v = first.ok() && *first ? (*first)->first : stream->visible_next();
    }
    from = v;
  }
  // A mirror whose import the owner refused (a contract revoked or
  // expired) gets nothing more: a subscription with nothing left to read
  // is answered with the whole reason, which its close (4003) could only
  // abridge.
  if (peering_ && stream->meta().producer == "import" && from >= stream->visible_next()) {
    if (auto info = peering_->import_info(stream->meta().name); info && info->state == "refused") {
      reject = http::Response::problem(
          409, "Conflict",
          stream->meta().name + " receives nothing more; its mirror holds tuples up to " +
              std::to_string(stream->visible_next() - 1) + ": " + info->reason,
          "\"import_state\":\"refused\",\"next_seq\":" + std::to_string(stream->visible_next()));
      return nullptr;
    }
  }
  return std::make_shared<Subscriber>(*this, stream, from, format);
}

}  // namespace entente::broker::detail
