#pragma once
// `entente broker --check --config FILE` (cli_check.cpp): validates a node's
// configuration without starting it. Prints "ok: ..." and returns 0, or
// prints every problem found (each with its configuration key) on stderr
// and returns 2 (the file does not load: a problem of each top-level
// section) or 1 (certificates, keys, ports, data_dir).

#include <string>

namespace entente::broker {

// Whether the listen ports are checked: not for a running node's file,
// whose ports the node holds (--running, before a SIGHUP reload).
enum class CheckPorts : bool { no = false, yes = true };

int check_config_file(const std::string& path, CheckPorts ports = CheckPorts::yes);

}  // namespace entente::broker
