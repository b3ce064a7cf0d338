#pragma once
// Running the `entente` command line as a user does, for the CLI tests
// (cli_admin_test, cli_ops_test): a shell command in a clean environment,
// its exit code, stdout and stderr, and readers for what it prints (tables,
// `key: value` lines).

#include <sys/stat.h>

#include <string>
#include <vector>

namespace entente::testing {

struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
};

bool has(const std::string& text, const std::string& needle);

// `s` as one shell word.
std::string quote(const std::string& s);

// Runs `entente ARGS` (shell syntax: redirections work) in a clean
// environment: none of the ENTENTE_* settings, no XDG_CONFIG_HOME, HOME at
// `home` (an empty folder unless a test puts a profile file there), then
// the assignments in `env`.
CliRun entente(const std::string& home, const std::string& args, const std::string& env = "");

// "exit N", stdout and stderr, for a failure message.
std::string what(const CliRun& r);

// The value of the `key: value` line of `out`, spaces trimmed; "<absent>"
// when there is none.
std::string value_of(const std::string& out, const std::string& key);

using Cells = std::vector<std::string>;
Cells cells(const std::string& line);
// The cells of the table row of `out` whose first cell is `first`; empty
// when there is none.
Cells row_of(const std::string& out, const std::string& first);

void write_file(const std::string& path, const std::string& text, mode_t mode = 0600);

}  // namespace entente::testing
