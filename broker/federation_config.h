#pragma once
// The `federation` section of a node's configuration is federation/config.h
// (the federation layer reads it); broker/config.cpp parses it into these
// types, under the broker's names.

#include "federation/config.h"

namespace entente::broker {

using federation::ExportConfig;
using federation::FederationConfig;
using federation::PeerDomainConfig;
using federation::PeerNodeConfig;

}  // namespace entente::broker
