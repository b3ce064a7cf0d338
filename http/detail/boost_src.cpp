// Beast compiled once for the whole program (BOOST_BEAST_SEPARATE_COMPILATION
// is set on entente_http). Asio itself is compiled in net/detail/asio_src.cpp.
#include <boost/beast/src.hpp>
