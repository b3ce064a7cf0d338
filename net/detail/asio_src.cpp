// Asio and Asio SSL compiled once for the whole program
// (BOOST_ASIO_SEPARATE_COMPILATION is set on entente_net and everything that
// links it), so files that use Asio compile in seconds, not minutes. Both the
// API transport (http) and the peer links (federation) use it.
#include <boost/asio/impl/src.hpp>
#include <boost/asio/ssl/impl/src.hpp>
