// The tutorial's client on lib/async: the five scenarios of examples/client, each call
// co_awaited on one io_context, against examples/server or examples/async_server.
//   async_client [--host ADDRESS] [--port PORT] [--transport tcp|cm]
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

asio::awaitable<void> run(asio::any_io_executor executor, tutorial::Address address) {
    async::Connection connection =
        must(co_await async::Connection::connect(executor, address.host, address.port, address.options), "connect");
    MemoryRegion local = must(connection.alloc_local_mr(tutorial::region_size), "alloc_local_mr");

    // (1) send 8 bytes
    std::memcpy(local.data(), "rdmaxx!!", 8);
    must(co_await connection.send(local.slice(0, 8)), "(1) send");
    // (2) the same with an immediate
    must(co_await connection.send_with_imm(local.slice(0, 8), tutorial::greeting_imm), "(2) send_with_imm");

    // (3) fill a region and lend it; the server READs it and gives it back
    MemoryRegion lent = must(connection.alloc_local_mr(1024), "(3) alloc_local_mr");
    tutorial::fill(lent.bytes(), 3);
    must(co_await connection.send_local_mr(std::move(lent)), "(3) send_local_mr");
    MemoryRegion back = must(co_await connection.receive_local_mr(), "(3) receive_local_mr");
    expect(back.size() == 1024 && tutorial::matches(back.bytes(), 3), "(3) the lent region came back intact");

    // (4) ask the server for a region, write half of it, hand it back
    RemoteMr remote = must(co_await connection.request_remote_mr(tutorial::region_size), "(4) request_remote_mr");
    const std::size_t half = tutorial::region_size / 2;
    tutorial::fill(local.bytes().first(half), 4);
    must(co_await connection.write(local.slice(0, half), remote.slice(0, half)), "(4) write");
    must(co_await connection.send_remote_mr(remote), "(4) send_remote_mr");
    expect(true, "(4) half a remote region written and handed back");

    // (5) the same with write_with_imm, the immediate marking the boundary
    remote = must(co_await connection.request_remote_mr(tutorial::region_size), "(5) request_remote_mr");
    const std::uint32_t boundary = 3000;
    tutorial::fill(local.bytes().first(boundary), 5);
    must(co_await connection.write_with_imm(local.slice(0, boundary), remote.slice(0, boundary), boundary),
         "(5) write_with_imm");
    must(co_await connection.send_remote_mr(remote), "(5) send_remote_mr");
    expect(true, "(5) written up to the boundary and handed back");
    must(co_await connection.close(), "close");
    fmt::print("async_client: all five scenarios passed\n");
}

} // namespace

int main(int argc, char** argv) {
    const auto address = tutorial::parse_address(argc, argv);
    asio::io_context io;
    asio::co_spawn(io, run(io.get_executor(), address), tutorial::rethrow);
    io.run(); // returns once nothing is left to do
    return 0;
}
