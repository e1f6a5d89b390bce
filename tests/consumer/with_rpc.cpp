// Uses lib/rpc (and through it lib/async and Asio): one endpoint serves and calls
// itself, an echo over the first RDMA device (rxe0 in the VM). Exit 0 only if the call
// came back with its bytes; without a device, the Error and exit 1.
#include <algorithm>
#include <array>
#include <cstdio>
#include <span>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <rdmaxx/rpc/endpoint.hpp>

// g++ 12's false positive on Asio's coroutine frames (bench/rpc.cpp says more).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {

constexpr std::uint16_t port = 31990;

asio::awaitable<void> call_self(rdmaxx::rpc::Endpoint* endpoint, int* status) {
    auto session = co_await endpoint->connect("127.0.0.1", port);
    if (!session) {
        std::printf("with rpc: connect: %s\n", session.error().message().c_str());
        *status = 1;
        co_return;
    }
    const std::array<std::byte, 5> request{std::byte{'h'}, std::byte{'e'}, std::byte{'l'}, std::byte{'l'}, std::byte{'o'}};
    std::array<std::byte, 16> response{};
    const auto got = co_await session->call(1, request, response);
    const bool echoed = got && *got == request.size() && std::equal(request.begin(), request.end(), response.begin());
    std::printf("with rpc: %s\n", echoed ? "echoed" : got ? "wrong echo" : got.error().message().c_str());
    *status = echoed ? 0 : 1;
}

} // namespace

int main() {
    asio::io_context io;
    auto endpoint = rdmaxx::rpc::Endpoint::create(io, {.listen_port = port});
    if (!endpoint) {
        std::printf("with rpc: no endpoint: %s\n", endpoint.error().message().c_str());
        return 1;
    }
    (*endpoint)->set_handler(1, [](rdmaxx::rpc::Request request, rdmaxx::rpc::Responder responder) {
        responder.respond(request.bytes());
    });
    int status = -1;
    asio::co_spawn(io, call_self(endpoint->get(), &status), asio::detached);
    while (status < 0)
        io.run_one();
    return status;
}
