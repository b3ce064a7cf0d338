#pragma once
// `entente broker --check --config FILE` (cli_check.cpp): validates a node's
// configuration without starting it. Prints "ok: ..." and returns 0, or
// prints every problem found (each with its configuration key) on stderr
// and returns 2 (the file does not load) or 1 (files or ports).

#include <string>

namespace entente::broker {

int check_config_file(const std::string& path);

}  // namespace entente::broker
