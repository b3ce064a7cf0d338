#pragma once
// The `entente` commands that speak to a running node's REST API (issue 16,
// docs/cli.md): streams, publish, queries, imports, nodes, peers, contracts,
// checkpoint. Each runs one blocking http::Client on the calling thread;
// every request has a deadline and every input a bound.
//
// Where the node is and which token to send come from, in this order,
// command-line flags (--url, --token, --ca), the environment (ENTENTE_URL,
// ENTENTE_TOKEN, ENTENTE_CA) and a profile (--profile NAME or
// ENTENTE_PROFILE) of $XDG_CONFIG_HOME/entente/profiles.json.
//
// Exit codes: 0 success; 1 the node refused (a 4xx or 5xx other than 404
// and 409); 2 a usage or configuration error; 3 the node could not be
// reached (connect, TLS, timeout); 4 not found (404); 5 conflict (409).

#include <string_view>
#include <vector>

namespace entente::broker {

// Whether `args` (argv without the program name) is one of these commands:
// its first word after any global option (--url, --token, --ca, --profile,
// --timeout with their values; --json) is streams, publish, queries,
// imports, nodes, peers, contracts or checkpoint, or a global option comes
// before any word.
bool is_api_command(const std::vector<std::string_view>& args);

// Runs it and returns the exit code (above). Messages go to stderr, results
// to stdout.
int run_api_command(const std::vector<std::string_view>& args);

}  // namespace entente::broker
