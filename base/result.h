// Error values for every module: Result<T> carries either a value or an Error
// with a code and a human-readable message. Failures that callers are
// expected to handle (bad input, bad JSON, type errors) are values; exceptions
// are only for programming errors.
#pragma once

#include <cassert>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace entente {

enum class Errc {
  ok = 0,
  invalid_argument = 1,  // a value outside what the API accepts
  parse_error = 2,       // text or bytes that do not parse
  type_error = 3,        // an expression or schema that does not type-check
  not_found = 4,         // a named thing that does not exist
  corrupt = 5,           // bytes that decode but are inconsistent
  limit_exceeded = 6,    // an input over a configured bound
  unsupported = 7,       // a valid request this build cannot serve
  already_exists = 8,    // a named thing that exists already
  unavailable = 9,       // temporarily unable: a full queue, shutting down
  io_error = 10,         // the disk or the operating system failed
  conflict = 11,         // the request contradicts the current state
  permission_denied = 12,  // an identity or grant does not allow this
};

const std::error_category& entente_category() noexcept;
inline std::error_code make_error_code(Errc e) noexcept {
  return {static_cast<int>(e), entente_category()};
}

// An error: a code to branch on and a message to show to a person.
struct Error {
  Errc code = Errc::invalid_argument;
  std::string message;
};

// Either a T or an Error. [[nodiscard]] so that an error cannot be dropped
// silently.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT
  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  T& value() & { assert(ok()); return std::get<0>(v_); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { assert(!ok()); return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Result<void>: success or an Error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT
  static Status Ok() { return {}; }
  bool ok() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  const Error& error() const { assert(!ok_); return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

inline Error make_error(Errc code, std::string message) {
  return Error{code, std::move(message)};
}

// One problem found while validating a document, located by a JSON path such
// as `$.boxes[2].options.predicates[0]`.
struct Diagnostic {
  std::string path;
  std::string message;
};

// Collects every problem of a validation pass, so that a user sees all of
// them at once instead of fixing one per round trip.
class Diagnostics {
 public:
  void error(std::string path, std::string message) {
    items_.push_back({std::move(path), std::move(message)});
  }
  bool ok() const noexcept { return items_.empty(); }
  size_t size() const noexcept { return items_.size(); }
  const std::vector<Diagnostic>& items() const noexcept { return items_; }
  // "path: message" lines joined by '\n'.
  std::string to_string() const;

 private:
  std::vector<Diagnostic> items_;
};

}  // namespace entente

template <>
struct std::is_error_code_enum<entente::Errc> : std::true_type {};

// Evaluates `expr` (a Status or Result); returns its error from the calling
// function when it failed.
#define ENTENTE_RETURN_IF_ERROR(expr)                \
  do {                                               \
    auto&& entente_status_ = (expr);                 \
    if (!entente_status_.ok()) return entente_status_.error(); \
  } while (0)

#define ENTENTE_CONCAT_INNER_(a, b) a##b
#define ENTENTE_CONCAT_(a, b) ENTENTE_CONCAT_INNER_(a, b)
// `ENTENTE_ASSIGN_OR_RETURN(auto x, f());` binds the value or returns the error.
#define ENTENTE_ASSIGN_OR_RETURN(lhs, expr)                               \
  auto ENTENTE_CONCAT_(entente_result_, __LINE__) = (expr);               \
  if (!ENTENTE_CONCAT_(entente_result_, __LINE__).ok())                   \
    return ENTENTE_CONCAT_(entente_result_, __LINE__).error();            \
  lhs = std::move(ENTENTE_CONCAT_(entente_result_, __LINE__)).value()
