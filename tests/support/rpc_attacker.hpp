// A hostile client of lib/rpc's device tests: its own UD transport, and a session set
// up by hand over TCP (the setup messages' codec), from which it sends what it likes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <rdmaxx/wrap/ah.hpp>

#include "packet.hpp"
#include "rpc_rig.hpp"
#include "session_codec.hpp"
#include "ud_transport.hpp"

namespace rdmaxx::rpc_test {

struct Attacker {
    std::unique_ptr<rpc::detail::UdTransport> ud;
    std::optional<AddressHandle> to_server;
    rpc::detail::SessionReply reply;
    std::uint64_t answers = 0; // what the server sent it back
    static void deliver(void* self, rpc::detail::UdSource, std::span<const std::byte>) {
        ++static_cast<Attacker*>(self)->answers;
    }
};

// Sets a session up for the attacker with the server listening at `server`, with its
// own UD address or, given one, `claimed`. Throws std::system_error if the server
// closes the connection instead of replying.
inline asio::awaitable<void> hostile_setup_at(asio::ip::tcp::endpoint server, Attacker* attacker,
                                              asio::ip::tcp::socket* socket, std::uint16_t number,
                                              std::optional<rpc::detail::UdAddress> claimed) {
    namespace d = rpc::detail;
    co_await socket->async_connect(server, asio::use_awaitable);
    const std::uint32_t payload = attacker->ud->mtu() - static_cast<std::uint32_t>(d::header_bytes);
    const d::SessionRequest request{.client = claimed.value_or(attacker->ud->address()),
                                    .session = {.number = number, .generation = 1},
                                    .limits = {.window = 8, .credits = 8, .max_request = 4096,
                                               .max_response = 4096, .payload_per_packet = payload}};
    const auto out = d::encode(request);
    co_await asio::async_write(*socket, asio::buffer(out), asio::use_awaitable);
    std::array<std::byte, d::session_reply_bytes> in{};
    co_await asio::async_read(*socket, asio::buffer(in), asio::use_awaitable);
    attacker->reply = must(d::decode_reply(in));
}

// The same with the Rig's server.
inline asio::awaitable<void> hostile_setup(Rig* rig, Attacker* attacker, asio::ip::tcp::socket* socket,
                                           std::uint16_t number = 7,
                                           std::optional<rpc::detail::UdAddress> claimed = {}) {
    return hostile_setup_at({asio::ip::make_address("127.0.0.1"), rig->port}, attacker, socket, number, claimed);
}

} // namespace rdmaxx::rpc_test
