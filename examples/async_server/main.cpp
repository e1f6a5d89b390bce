// The tutorial's server on lib/async: the five scenarios of examples/server, each call
// co_awaited on one io_context (the protocol is the same: either side may be blocking).
//   async_server [--host ADDRESS] [--port PORT] [--transport tcp|cm]
// The standard library before Asio: Asio picks its allocator (aligned_alloc or
// operator new) by what the standard library has defined when Asio's config is read,
// and lib/async, built that way, frees what this program allocates (ASan checks it).
#include <cstdlib>
#include <exception>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <rdmaxx/async/connection.hpp>

#include "../tutorial.hpp"

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

using namespace rdmaxx;
using tutorial::expect;
using tutorial::must;

namespace {

asio::awaitable<void> serve(async::Listener& listener) {
    async::Connection connection = must(co_await listener.accept(std::chrono::seconds(60)), "accept");
    std::array<std::byte, 64> message{};

    // (1) a message of 8 bytes
    Received got = must(co_await connection.receive(message), "(1) receive");
    expect(got.size == 8 && std::memcmp(message.data(), "rdmaxx!!", 8) == 0 && !got.imm, "(1) 8 bytes received");

    // (2) the same with an immediate
    got = must(co_await connection.receive(message), "(2) receive");
    expect(got.size == 8 && got.imm == tutorial::greeting_imm, "(2) 8 bytes and the immediate received");

    // (3) the client lends a region; we READ it and give it back
    const RemoteMr lent = must(co_await connection.receive_remote_mr(), "(3) receive_remote_mr");
    MemoryRegion local = must(connection.alloc_local_mr(tutorial::region_size), "(3) alloc_local_mr");
    must(co_await connection.read(local.slice(0, lent.memory.length), lent.memory), "(3) read");
    expect(tutorial::matches(local.bytes().first(lent.memory.length), 3), "(3) RDMA READ of the lent region");
    must(co_await connection.send_remote_mr(lent), "(3) send_remote_mr");

    // (4) the client asks for a region, writes half of it and hands it back
    MemoryRegion returned = must(co_await connection.receive_local_mr(), "(4) receive_local_mr");
    const std::size_t half = returned.size() / 2;
    expect(tutorial::matches(returned.bytes().first(half), 4) && tutorial::zero(returned.bytes().subspan(half)),
           "(4) first half written, second half untouched");

    // (5) the same with write_with_imm: the immediate is where the data ends
    const std::uint32_t boundary = must(co_await connection.receive_write_imm(), "(5) receive_write_imm");
    returned = must(co_await connection.receive_local_mr(), "(5) receive_local_mr");
    expect(boundary < returned.size() && tutorial::matches(returned.bytes().first(boundary), 5) &&
               tutorial::zero(returned.bytes().subspan(boundary)),
           fmt::format("(5) {} bytes written, as the immediate says", boundary));
    // the client says goodbye when it is done; then we close too
    const auto bye = co_await connection.receive(message);
    expect(!bye && bye.error().code() == ECONNRESET, "the client closed");
    must(co_await connection.close(), "close");
    fmt::print("async_server: all five scenarios passed\n");
}

} // namespace

int main(int argc, char** argv) {
    const auto address = tutorial::parse_address(argc, argv);
    asio::io_context io;
    async::Listener listener =
        must(async::Listener::listen(io.get_executor(), address.host, address.port, address.options), "listen");
    fmt::print("async_server: listening on {}:{}\n", address.host, listener.port());
    std::fflush(stdout);
    asio::co_spawn(io, serve(listener), [&io](std::exception_ptr thrown) {
        tutorial::rethrow(thrown);
        io.stop(); // a live Listener would keep run() going
    });
    io.run();
    return 0;
}
