#pragma once
// The one reader of OpenSSL's per-thread error queue, for messages that say
// why OpenSSL refused something ("no start line", "key values mismatch").
// Used by certs/, the API's TLS (http/, net/tls.h) and the peer links
// (federation/). Declared without OpenSSL's headers.

#include <string>
#include <string_view>

namespace entente::base {

// The reason of the most recent error on this thread's OpenSSL error queue,
// or `fallback` when the queue is empty. Empties the queue, so the next
// operation's errors are not mistaken for this one's.
std::string openssl_reason(std::string_view fallback);

// "<what>: <reason of the most recent error>", or `what` alone when the
// queue is empty. Leaves the queue as it is: certs/ pops what it pushed with
// a mark of its own (certs/detail/ossl.h, ErrorScope).
std::string openssl_error(std::string_view what);

}  // namespace entente::base
