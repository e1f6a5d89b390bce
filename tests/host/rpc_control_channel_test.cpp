// ControlChannel::peer_host (control_channel.hpp): the host a session's control
// connection comes from, the lane its setup takes a turn at the helpers in
// (async::PeerTurn). Over TCP on this host's loopback: no device.
#include <string>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>

#include <doctest/doctest.h>

#include "control_channel.hpp"

namespace {

using asio::ip::tcp;

// peer_host() of the accepted end of a connection from `from` to a listener on
// `listen_on`.
std::string accepted_peer_host(const char* listen_on, const char* from) {
    asio::io_context io;
    tcp::acceptor acceptor(io, {asio::ip::make_address(listen_on), 0});
    tcp::socket client(io);
    client.open(asio::ip::make_address(from).is_v4() ? tcp::v4() : tcp::v6());
    client.bind({asio::ip::make_address(from), 0});
    client.connect({asio::ip::make_address(from), acceptor.local_endpoint().port()});
    const rdmaxx::rpc::detail::ControlChannel accepted(acceptor.accept());
    return accepted.peer_host();
}

} // namespace

TEST_CASE("a control connection's peer host: an IPv4 address; an IPv6 address's /64; IPv4 through a dual-stack "
          "listener as IPv4") {
    CHECK(accepted_peer_host("127.0.0.1", "127.0.0.1") == "127.0.0.1");
    CHECK(accepted_peer_host("127.0.0.2", "127.0.0.2") == "127.0.0.2");
    CHECK(accepted_peer_host("::1", "::1") == "::/64");
    CHECK(accepted_peer_host("::", "127.0.0.3") == "127.0.0.3"); // ::ffff:127.0.0.3 on the listener's side
}
