// What lib/rpc's device tests share: a server and a client endpoint on one io_context
// (the server's handlers: echo, drop_it, hold_it), checkable messages, and loops that
// run the io_context (an endpoint keeps run() from returning).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <rdmaxx/rpc/endpoint.hpp>

#include "check.hpp"

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace rdmaxx::rpc_test {

using test::must;

using namespace std::chrono_literals;

constexpr std::uint8_t echo = 1, drop_it = 2, hold_it = 3, later = 5, unknown = 9;

inline std::uint16_t next_port() {
    static std::uint16_t port = 31850;
    return port++;
}

// Message n: n % 251 repeated, then its length's low byte: any size, checkable.
inline std::vector<std::byte> message(std::uint32_t n, std::size_t size) {
    std::vector<std::byte> bytes(size, static_cast<std::byte>(n % 251));
    if (size > 0)
        bytes.back() = static_cast<std::byte>(size);
    return bytes;
}

// Whether `response` starts with `request`'s bytes (memcmp may not take an empty
// vector's null data()).
inline bool echoed(std::span<const std::byte> response, std::span<const std::byte> request) {
    return response.size() >= request.size() && std::ranges::equal(response.first(request.size()), request);
}

// Runs `work` on `io` until it finishes, within `limit` (the endpoints keep run() busy).
// Returns how many handlers of the io_context ran. With `thrown`: a std::runtime_error
// out of run() (an application handler's, thrown on purpose) is counted there, and the
// io_context run again.
inline std::size_t run(asio::io_context& io, asio::awaitable<void> work, std::chrono::seconds limit,
                       int* thrown = nullptr) {
    bool done = false;
    asio::co_spawn(io, std::move(work), [&done](std::exception_ptr e) {
        done = true;
        if (e)
            std::rethrow_exception(e);
    });
    std::size_t handlers = 0;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done && std::chrono::steady_clock::now() < deadline) {
        try {
            handlers += io.run_for(10ms);
        } catch (const std::runtime_error&) {
            if (thrown == nullptr)
                throw;
            ++*thrown;
        }
    }
    REQUIRE(done);
    return handlers;
}

// Runs `io` for `span` (what is in flight moves on).
inline void spin(asio::io_context& io, std::chrono::milliseconds span) {
    const auto deadline = std::chrono::steady_clock::now() + span;
    while (std::chrono::steady_clock::now() < deadline)
        io.run_for(5ms);
}

struct Rig {
    asio::io_context io;
    std::unique_ptr<rpc::Endpoint> server;
    std::unique_ptr<rpc::Endpoint> client;
    std::vector<rpc::Responder> held; // hold_it's requests, unanswered
    std::uint16_t port = next_port();
    std::string address; // the server listens on (TCP: loopback; RDMA CM: the device's)

    explicit Rig(rpc::EndpointOptions server_options = {}, rpc::EndpointOptions client_options = {},
                 std::string listen_on = "127.0.0.1")
        : address(std::move(listen_on)) {
        server_options.listen_port = port;
        server_options.listen_address = address;
        server = must(rpc::Endpoint::create(io, server_options));
        client = must(rpc::Endpoint::create(io, client_options));
        server->set_handler(echo, [](rpc::Request request, rpc::Responder responder) {
            responder.respond(request.bytes());
        });
        server->set_handler(drop_it, [](rpc::Request, rpc::Responder) {});
        server->set_handler(hold_it, [this](rpc::Request, rpc::Responder responder) {
            held.push_back(std::move(responder));
        });
    }
    ~Rig() { held.clear(); }
};

inline asio::awaitable<void> connect_into(Rig* rig, std::optional<rpc::Session>* out) {
    auto session = co_await rig->client->connect("127.0.0.1", rig->port);
    REQUIRE_MESSAGE(session.has_value(), (session ? "" : session.error().message()));
    out->emplace(std::move(*session));
}

// In a coroutine: lets the io_context work for `span`.
inline asio::awaitable<void> pause(std::chrono::milliseconds span) {
    asio::steady_timer timer(co_await asio::this_coro::executor, span);
    co_await timer.async_wait(asio::use_awaitable);
}

// In a coroutine: until `done()` holds, looking every millisecond.
template <class Done>
asio::awaitable<void> until(Done done) {
    while (!done())
        co_await pause(1ms);
}

// A call of `type` (one the server holds) cancelled (terminally unless told) `after` it
// began: how it ended. `request` and `response`: what Session::call takes (spans'
// owners, or MessageBuffers).
template <class Request, class Response>
asio::awaitable<Result<std::size_t>> cancelled_call(rpc::Session* session, std::uint8_t type, Request& request,
                                                    Response& response, std::chrono::milliseconds after,
                                                    asio::cancellation_type how = asio::cancellation_type::terminal) {
    asio::cancellation_signal cancel;
    std::optional<Result<std::size_t>> ended;
    session->call(type, request, response, {.timeout = 10s},
                  asio::bind_cancellation_slot(cancel.slot(), [&ended](Result<std::size_t> r) { ended = std::move(r); }));
    co_await pause(after);
    cancel.emit(how);
    while (!ended)
        co_await pause(1ms);
    co_return std::move(*ended);
}

} // namespace rdmaxx::rpc_test
