#pragma once
// `entente certs ...`: create domain CAs, issue node certificates, show a
// certificate. The broker's command line dispatches here; tests call it
// directly with their own streams.

#include <ostream>
#include <string>
#include <vector>

namespace entente::certs {

// Runs `entente certs ARGS...` (`args` is what follows `certs`):
//   init-domain NAME --out DIR [--key ec-p256|ed25519] [--days N] [--force]
//   issue-node DOMAIN NODE --ca DIR --san a,b,c --out DIR [--key ...] [--days N] [--force]
//   show FILE
// and `--help` for each. Output for people goes to `out`, errors to `err`.
// Returns the exit code: 0 done, 1 the operation failed, 2 bad usage.
int run_certs(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace entente::certs
