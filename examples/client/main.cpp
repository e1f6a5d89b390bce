// The tutorial's client: the five scenarios against examples/server.
//   client [--host ADDRESS] [--port PORT] [--transport tcp|cm]
#include "../tutorial.hpp"

using namespace rdmaxx;
using tutorial::expect;
using tutorial::must;

int main(int argc, char** argv) {
    const auto address = tutorial::parse_address(argc, argv);
    Connection connection = must(Connection::connect(address.host, address.port, address.options), "connect");
    MemoryRegion local = must(connection.alloc_local_mr(tutorial::region_size), "alloc_local_mr");

    // (1) send 8 bytes
    std::memcpy(local.data(), "rdmaxx!!", 8);
    must(connection.send(local.slice(0, 8)), "(1) send");
    // (2) the same with an immediate
    must(connection.send_with_imm(local.slice(0, 8), tutorial::greeting_imm), "(2) send_with_imm");

    // (3) fill a region and lend it; the server READs it and gives it back
    MemoryRegion lent = must(connection.alloc_local_mr(1024), "(3) alloc_local_mr");
    tutorial::fill(lent.bytes(), 3);
    must(connection.send_local_mr(std::move(lent)), "(3) send_local_mr");
    MemoryRegion back = must(connection.receive_local_mr(), "(3) receive_local_mr");
    expect(back.size() == 1024 && tutorial::matches(back.bytes(), 3), "(3) the lent region came back intact");

    // (4) ask the server for a region, write half of it, hand it back
    RemoteMr remote = must(connection.request_remote_mr(tutorial::region_size), "(4) request_remote_mr");
    const std::size_t half = tutorial::region_size / 2;
    tutorial::fill(local.bytes().first(half), 4);
    must(connection.write(local.slice(0, half), remote.slice(0, half)), "(4) write");
    must(connection.send_remote_mr(remote), "(4) send_remote_mr");
    expect(true, "(4) half a remote region written and handed back");

    // (5) the same with write_with_imm, the immediate marking the boundary
    remote = must(connection.request_remote_mr(tutorial::region_size), "(5) request_remote_mr");
    const std::uint32_t boundary = 3000;
    tutorial::fill(local.bytes().first(boundary), 5);
    must(connection.write_with_imm(local.slice(0, boundary), remote.slice(0, boundary), boundary),
         "(5) write_with_imm");
    must(connection.send_remote_mr(remote), "(5) send_remote_mr");
    expect(true, "(5) written up to the boundary and handed back");
    fmt::print("client: all five scenarios passed\n");
    return 0;
}
