#pragma once
// What the `entente` API commands (cli_api.h) share, for the files that
// implement them: cli_api.cpp (settings, streams, queries, nodes, peers,
// contracts list/show, dispatch), cli_contracts.cpp (contract actions and
// usage), cli_publish.cpp (publish, imports). Private to the executable:
// nothing else includes it.

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"
#include "http/client.h"
#include "rapidjson/document.h"

namespace entente::broker::cli {

using rapidjson::Value;

// The exit codes of these commands (cli_api.h).
enum class Exit : int { ok = 0, refused = 1, usage = 2, unreachable = 3, not_found = 4, conflict = 5 };

enum class Output { table, json };

// A body the node takes with its default api.limits.max_body_bytes; the
// node answers a larger one 413 after it was sent, so it is refused here.
constexpr uint64_t kMaxRequestBody = 16u << 20;

// ------------------------------------------------------------ text

// `s` safe to print on a terminal: control bytes become '?'.
std::string printable(std::string_view s);
size_t display_width(std::string_view s);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
std::string number_text(double v);
// Unix milliseconds as RFC 3339 UTC.
std::string time_text(int64_t ms);
// A whole decimal number, nothing else around it.
std::optional<uint64_t> parse_uint(std::string_view s);
bool all_digits(std::string_view s);

// Rows under a header, each column as wide as its widest cell, two spaces
// apart; the last column is not padded.
class Table final {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row);
  void print() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// `key: value` lines, the values aligned.
class Fields final {
 public:
  void add(std::string key, std::string value) { items_.emplace_back(std::move(key), printable(value)); }
  void print() const;

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

// ------------------------------------------------------------ JSON answers

const Value* get(const Value& o, std::string_view key);
std::string compact(const Value& v);
// A value as one cell: "-" for null or absent.
std::string text_of(const Value* v);
std::string field(const Value& o, std::string_view key);
uint64_t uint_of(const Value& o, std::string_view key);
size_t size_of(const Value& o, std::string_view key);
Value::ConstArray array_of(const Value& o, std::string_view key);
// Adds `key` of `o` to `f` when `o` has it.
void add_member(Fields& f, const Value& o, std::string_view key);
// An answer the commands do not understand (printed); Exit::refused.
Exit unexpected(std::string_view what);
// A usage error (printed); Exit::usage.
Exit usage_error(const std::string& message);

// The contents of `path` ("-": standard input), at most `limit` bytes.
Result<std::string> read_bounded(const std::string& path, uint64_t limit, const std::string& what,
                                 std::string_view why_limit);

// ------------------------------------------------------------ the command line

// One option of a command.
struct OptionSpec {
  std::string_view name;  // "--schema"
  bool takes_value = false;
};

// A command's words (after its group and action) and options.
struct CommandLine {
  std::vector<std::string> words;
  std::map<std::string, std::string, std::less<>> values;
  std::set<std::string, std::less<>> switches;

  const std::string* value(std::string_view name) const {
    const auto it = values.find(name);
    return it == values.end() ? nullptr : &it->second;
  }
  bool has(std::string_view name) const { return switches.count(name) > 0; }
};

// A name for a request path, percent-encoding the slash of "acme/bids".
Result<std::string> path_name(std::string_view name, std::string_view what);

// ------------------------------------------------------------ requests

// Where and how to reach the node.
struct Settings {
  http::ClientOptions client;
  std::string url;    // as given
  std::string token;  // "" for none
  std::string token_from;
};

// A node's API over one keep-alive connection, opened by the first request.
// call() prints each failure (stderr) where it happens, so callers only
// pass the exit code on. Not thread-safe; one command, one thread.
class Api final {
 public:
  struct Reply {
    Exit exit = Exit::ok;
    unsigned status = 0;
    std::string body;
  };
  using Headers = std::vector<std::pair<std::string, std::string>>;

  Api(Settings settings, Output output) : settings_(std::move(settings)), output_(output) {}
  Api(const Api&) = delete;
  Api& operator=(const Api&) = delete;

  Output output() const { return output_; }

  // One request. A 2xx answer: Exit::ok and its body. Otherwise the failure
  // is printed and `exit` says which.
  Reply call(std::string_view method, const std::string& target, std::string_view body = {});

  // One request as sent, nothing printed: for a caller that retries (a
  // publish with its producer id, which may be sent again). Connects first
  // when there is no connection; a failed request drops the connection.
  Result<http::ClientResponse> send(std::string_view method, const std::string& target, std::string_view body,
                                    std::string_view content_type, const Headers& extra);

  // "entente: METHOD TARGET: STATUS: DETAIL", then a validation problem's
  // `errors`, one per line.
  void report_refusal(std::string_view method, const std::string& target,
                      const http::ClientResponse& r) const;
  // "cannot reach the node at URL: ..." with a hint.
  void report_unreachable(const Error& e) const;

  // The exit code of a non-2xx status.
  static Exit exit_for(unsigned status) {
    return status == 404 ? Exit::not_found : status == 409 ? Exit::conflict : Exit::refused;
  }

 private:
  Exit connect();
  std::string connect_hint(const std::string& m) const;

  Settings settings_;
  Output output_;
  std::unique_ptr<http::Client> client_;
};

using Reply = Api::Reply;
using Formatter = Exit (*)(const Value&);
using Runner = Exit (*)(Api&, const CommandLine&);

// Prints an answer: as received with --json, else by `format`.
Exit emit(const Api& api, const Reply& r, Formatter format);
// GET `target`, printed by `format`.
Exit get_and_print(Api& api, const std::string& target, Formatter format);
// A 2xx's confirmation: a line for a person, nothing for a script.
Exit done(const Api& api, const std::string& what);

// ------------------------------------------------------------ contracts (cli_api.cpp)

Exit print_contract(const Value& c);

// ------------------------------------------------------------ cli_contracts.cpp

Exit contracts_propose(Api& api, const CommandLine& c);
Exit contracts_counter(Api& api, const CommandLine& c);
Exit contracts_accept(Api& api, const CommandLine& c);
Exit contracts_reject(Api& api, const CommandLine& c);
Exit contracts_revoke(Api& api, const CommandLine& c);
Exit contracts_usage(Api& api, const CommandLine& c);
// The options of propose and counter (the terms).
const std::vector<OptionSpec>& contract_terms_options();

// ------------------------------------------------------------ cli_fragments.cpp

Exit queries_move(Api& api, const CommandLine& c);
Exit queries_split(Api& api, const CommandLine& c);
Exit queries_merge(Api& api, const CommandLine& c);
Exit nodes_remove(Api& api, const CommandLine& c);

// ------------------------------------------------------------ cli_publish.cpp

Exit publish(Api& api, const CommandLine& c);
Exit imports_list(Api& api, const CommandLine& c);
Exit imports_show(Api& api, const CommandLine& c);
Exit imports_create(Api& api, const CommandLine& c);
Exit imports_delete(Api& api, const CommandLine& c);

}  // namespace entente::broker::cli
