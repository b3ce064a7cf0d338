#pragma once
// The `entente` command line: subcommands, --help, --version. Returns the
// process exit code: 0 success, 1 a runtime failure, 2 a usage error; the
// commands that speak to a node's API (cli_api.h) also 3, 4 and 5.

namespace entente::broker {

int run_cli(int argc, char** argv);

}  // namespace entente::broker
