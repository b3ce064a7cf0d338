#pragma once

// Tells a service manager how the node is doing, as systemd's Type=notify
// expects (sd_notify(3)): a datagram of KEY=VALUE lines to the unix socket
// named by $NOTIFY_SOCKET. Without that variable it does nothing, so a node
// started by hand or by a test is unaffected. No libsystemd: the protocol is
// one datagram, and Debian's hosts without systemd need no extra package.

#include <string_view>

#include "base/result.h"

namespace entente::broker {

// Sends `state` (e.g. "READY=1", "STOPPING=1", "RELOADING=1") to the socket
// in $NOTIFY_SOCKET: a path, or an abstract name starting with '@'. Ok when
// there is no such variable; an error naming the socket when the send fails
// (the caller logs it: a manager that does not hear READY stops the node
// after its start timeout, and the log says why).
Status notify_service(std::string_view state);

}  // namespace entente::broker
