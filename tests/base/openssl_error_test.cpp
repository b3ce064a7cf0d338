// base/openssl_error.h: the one reader of OpenSSL's error queue, used by
// certs/, the API's TLS and the peer links.
#include "base/openssl_error.h"

#include <openssl/err.h>
#include <openssl/pem.h>

#include <gtest/gtest.h>

namespace entente::base {
namespace {

TEST(OpensslError, ReasonTakesTheLatestErrorAndEmptiesTheQueue) {
  ERR_clear_error();
  ERR_raise(ERR_LIB_PEM, PEM_R_BAD_END_LINE);
  ERR_raise(ERR_LIB_PEM, PEM_R_NO_START_LINE);
  EXPECT_EQ(openssl_reason("fallback"), "no start line");
  EXPECT_EQ(ERR_peek_error(), 0u);
  EXPECT_EQ(openssl_reason("fallback"), "fallback");
}

TEST(OpensslError, ErrorNamesWhatFailedAndLeavesTheQueue) {
  ERR_clear_error();
  EXPECT_EQ(openssl_error("cannot read ca.pem"), "cannot read ca.pem");
  ERR_raise(ERR_LIB_PEM, PEM_R_NO_START_LINE);
  EXPECT_EQ(openssl_error("cannot read ca.pem"), "cannot read ca.pem: no start line");
  // certs/ pops what it pushed with its own mark; this must not.
  EXPECT_NE(ERR_peek_error(), 0u);
  ERR_clear_error();
}

}  // namespace
}  // namespace entente::base
