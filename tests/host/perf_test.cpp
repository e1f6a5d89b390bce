// rdmaxx-perf's pure logic: its command line, its wire messages, perftest's arithmetic
// and its output.
#include <array>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "options.hpp"
#include "protocol.hpp"
#include "report.hpp"
#include "stats.hpp"

#include "../support/check.hpp"

using namespace rdmaxx;
using namespace rdmaxx::perf;
using rdmaxx::test::must;
using rdmaxx::test::must_fail;

namespace {

Result<Options> parse(std::vector<std::string_view> args) { return parse_options(args); }

void expect_invalid(std::vector<std::string_view> args, std::string_view why) {
    const Error e = must_fail(parse(args));
    CHECK(e.is_errno(EINVAL));
    CHECK_MESSAGE(fmt::format("{}", e).find(why) != std::string::npos, fmt::format("{}", e));
}

void expect_malformed(Result<void> result, std::string_view why) {
    const Error e = must_fail(std::move(result));
    CHECK(e.kind() == Error::Kind::protocol);
    CHECK_MESSAGE(fmt::format("{}", e).find(why) != std::string::npos, fmt::format("{}", e));
}

} // namespace

TEST_CASE("perf options: every test name, perftest's defaults per kind") {
    for (const char* name : {"write_lat", "write_bw", "read_lat", "read_bw", "send_lat", "send_bw", "write_imm_lat",
                             "write_imm_bw", "atomic_lat", "atomic_bw"})
        CHECK(test_name(*parse_test(name)) == name);
    CHECK_FALSE(parse_test("write"));
    const Options lat = must(parse({"write_lat"}));
    CHECK(lat.host.empty());
    CHECK(lat.sizes == std::vector<std::uint32_t>{2});
    CHECK(lat.iters == 1000);
    CHECK(lat.port == 18515);
    CHECK(lat.tx_depth == 1);
    CHECK(lat.cq_mod == 100);
    const Options bw = must(parse({"send_bw", "10.0.0.1"}));
    CHECK(bw.host == "10.0.0.1");
    CHECK(bw.sizes == std::vector<std::uint32_t>{65536});
    CHECK(bw.iters == 5000);
    CHECK(bw.tx_depth == 128);
    CHECK(must(parse({"atomic_bw"})).sizes == std::vector<std::uint32_t>{8});
}

TEST_CASE("perf options: perftest's letters and long names, attached or not") {
    const Options o = must(parse({"write_bw", "host", "-d", "mlx5_0", "-i", "2", "-x", "3", "-p", "9000", "-s", "4096",
                                  "-n", "77", "-t", "256", "-r", "64", "-l", "8", "-Q", "16", "-I", "100", "-m", "2048",
                                  "-q", "4", "-R", "--json", "--timeout=2500"}));
    CHECK(o.device == "mlx5_0");
    CHECK(o.ib_port == 2);
    CHECK(o.gid_index == 3u);
    CHECK(o.port == 9000);
    CHECK(o.sizes == std::vector<std::uint32_t>{4096});
    CHECK(o.iters == 77);
    CHECK(o.tx_depth == 256);
    CHECK(o.rx_depth == 64);
    CHECK(o.post_list == 8);
    CHECK(o.cq_mod == 16);
    CHECK(o.inline_size == 100u);
    CHECK(o.mtu == Mtu::b2048);
    CHECK(o.qps == 4);
    CHECK(o.rdma_cm);
    CHECK(o.json);
    CHECK(o.timeout == std::chrono::milliseconds(2500));
    CHECK(must(parse({"atomic_lat", "--atomic_type=CMP_AND_SWAP"})).atomic == AtomicOp::compare_swap);
    CHECK(must(parse({"--size=128", "read_lat"})).sizes == std::vector<std::uint32_t>{128});
    CHECK(must(parse({"-h"})).help);
}

TEST_CASE("perf options: --async takes a mode, for the one-sided tests only") {
    CHECK(must(parse({"read_lat", "h", "--async", "busy"})).async == AsyncMode::busy);
    CHECK(must(parse({"write_bw", "h", "--async=event"})).async == AsyncMode::event);
    CHECK(must(parse({"atomic_bw", "h", "--async", "hybrid"})).async == AsyncMode::hybrid);
    CHECK(must(parse({"read_bw", "h"})).async == AsyncMode::off);
    expect_invalid({"read_lat", "--async", "spin"}, "busy, event or hybrid, not 'spin'");
    expect_invalid({"write_lat", "--async", "busy"}, "not write_lat");
    expect_invalid({"send_bw", "--async", "busy"}, "not send_bw");
    CHECK(must(parse({"write_bw", "h", "--async", "busy", "-l", "16"})).post_list == 16);
    CHECK(async_mode_name(AsyncMode::hybrid) == "hybrid");
}

TEST_CASE("perf options: the sweep goes 2 B to 8 MiB, atomics stay at 8 B") {
    const Options o = must(parse({"write_lat", "-a"}));
    REQUIRE(o.sizes.size() == 23);
    CHECK(o.sizes.front() == 2);
    CHECK(o.sizes.back() == 8u << 20);
    CHECK(must(parse({"atomic_lat", "-a"})).sizes == std::vector<std::uint32_t>{8});
}

TEST_CASE("perf options: the RPC tests take a size, a window and sessions, on lib/rpc in a mode") {
    const Options lat = must(parse({"rpc_lat", "h"}));
    CHECK(test_name(lat.test) == "rpc_lat");
    CHECK(lat.sizes == std::vector<std::uint32_t>{32});
    CHECK(lat.window == 1);
    CHECK(lat.sessions == 1);
    CHECK(lat.iters == 1000);
    CHECK(lat.async == AsyncMode::busy);
    const Options bw = must(parse({"rpc_bw", "h", "-w", "64", "--sessions=4", "-s", "4096", "--async", "event"}));
    CHECK(bw.window == 64);
    CHECK(bw.sessions == 4);
    CHECK(bw.sizes == std::vector<std::uint32_t>{4096});
    CHECK(bw.async == AsyncMode::event);
    CHECK_FALSE(bw.one_way);
    CHECK(must(parse({"rpc_bw"})).window == 32);
    CHECK(must(parse({"rpc_bw", "h", "--one-way", "-s", "1048576"})).one_way);
    CHECK(bw.form == CallForm::awaitable);
    CHECK(must(parse({"rpc_lat", "h", "--callbacks"})).form == CallForm::callback);
    CHECK(must(parse({"rpc_lat", "h", "--task"})).form == CallForm::task);
    CHECK_FALSE(bw.rdma_threshold);
    CHECK(must(parse({"rpc_lat", "h", "--rdma-threshold", "0"})).rdma_threshold == 0u);
    CHECK_FALSE(bw.windows);
    CHECK(must(parse({"rpc_bw", "h", "--windows"})).windows);
    const Options sweep = must(parse({"rpc_lat", "-a"}));
    CHECK(sweep.sizes.front() == 2);
    CHECK(sweep.sizes.back() == rpc_max_size);
    expect_invalid({"rpc_lat", "h", "-w", "2"}, "one call at a time");
    expect_invalid({"rpc_lat", "h", "--sessions", "2"}, "one call at a time");
    expect_invalid({"rpc_bw", "h", "-q", "2"}, "not --qp");
    expect_invalid({"rpc_bw", "h", "-s", "2097152"}, "at most 1048576 bytes");
    expect_invalid({"rpc_bw", "h", "-w", "1025"}, "outside 1..1024");
    expect_invalid({"write_bw", "h", "-w", "4"}, "the RPC tests'");
    expect_invalid({"write_bw", "h", "--one-way"}, "the RPC tests'");
    expect_invalid({"write_lat", "h", "--callbacks"}, "the RPC tests'");
    expect_invalid({"write_lat", "h", "--rdma-threshold", "4096"}, "the RPC tests'");
    expect_invalid({"write_lat", "h", "--windows"}, "the RPC tests'");
    expect_invalid({"rpc_lat", "h", "--rdma-threshold", "2097152"}, "outside 0..1048576");
}

TEST_CASE("perf report: the RPC tests' banner, perftest's columns, their own JSON fields") {
    const Setup setup{.test = {Verb::rpc, Measure::bandwidth}, .device = "rxe0", .mtu_bytes = 1024,
                      .async = AsyncMode::busy, .window = 32, .sessions = 2};
    const std::string head = table_head(setup);
    CHECK(head.find("RPC BW Test") != std::string::npos);
    CHECK(head.find("Window         : 32") != std::string::npos);
    CHECK(head.find("MsgRate[Mpps]") != std::string::npos);
    const std::string json = bandwidth_json(setup, 32, 1000, {.mpps = 0.5, .cpu_us_per_op = 2, .retransmissions = 3});
    CHECK(json.find("\"test\":\"rpc_bw\"") != std::string::npos);
    CHECK(json.find("\"async\":\"busy\",\"cpu_us_per_op\":2.000,\"window\":32,\"sessions\":2,\"one_way\":false,"
                    "\"form\":\"asio::awaitable\",\"retransmissions\":3}") != std::string::npos);
    CHECK(head.find("SIZE bytes each way (echo)") != std::string::npos);
    CHECK(head.find("Completions    : busy, to asio::awaitable") != std::string::npos);
    Setup one_way = setup;
    one_way.one_way = true;
    one_way.form = CallForm::callback;
    CHECK(table_head(one_way).find("answers empty") != std::string::npos);
    CHECK(table_head(one_way).find("to callbacks") != std::string::npos);
    CHECK(bandwidth_json(one_way, 32, 1000, {}).find("\"form\":\"callbacks\"") != std::string::npos);
}

TEST_CASE("perf options: bad input is an error that says what is wrong") {
    expect_invalid({}, "give a TEST");
    expect_invalid({"write_lat", "a", "b"}, "give a TEST");
    expect_invalid({"write_latency"}, "unknown test 'write_latency'");
    expect_invalid({"write_lat", "--frobnicate"}, "unknown option --frobnicate");
    expect_invalid({"write_lat", "-s"}, "-s needs a value");
    expect_invalid({"write_lat", "-s", "12x"}, "-s takes a number, not '12x'");
    expect_invalid({"write_lat", "-s", "1"}, "-s 1 outside 2..8388608");
    expect_invalid({"write_lat", "-s", "8388609"}, "outside");
    expect_invalid({"write_lat", "-s", "99999999999999999999999"}, "takes a number");
    expect_invalid({"write_lat", "-n", "4"}, "-n 4 outside 5..");
    expect_invalid({"write_lat", "-p", "0"}, "outside 1..65535");
    expect_invalid({"write_lat", "-m", "1000"}, "--mtu takes 256");
    expect_invalid({"atomic_lat", "-A", "SWAP"}, "FETCH_AND_ADD or CMP_AND_SWAP");
    expect_invalid({"atomic_lat", "-s", "16"}, "atomics move 8 bytes");
    expect_invalid({"write_bw", "-a", "-s", "64"}, "exclude each other");
    expect_invalid({"write_lat", "-q", "2"}, "one QP");
    expect_invalid({"write_lat", "-l", "2"}, "one WR at a time");
    expect_invalid({"write_bw", "-l", "3"}, "must divide --tx-depth 128");
    expect_invalid({"write_bw", "-l", "65"}, "outside 1..64");
    expect_invalid({"read_lat", "-I", "64"}, "cannot be inline");
}

TEST_CASE("perf options: signal interval and default inline follow perftest") {
    Options o = must(parse({"write_bw"}));
    CHECK(signal_interval(o, 64) == 100);
    CHECK(signal_interval(o, 8192) == 100);
    CHECK(signal_interval(o, 8193) == 1); // every WR above 8 KiB
    o.post_list = 8;
    CHECK(signal_interval(o, 64) == 104); // whole post lists
    CHECK(signal_interval(o, 65536) == 8);
    o.cq_mod = 1000;
    CHECK(signal_interval(o, 64) == 128); // never beyond the TX depth
    const Test write_lat{Verb::write, Measure::latency}, send_lat{Verb::send, Measure::latency};
    CHECK(default_inline(write_lat, true, 512) == 220);
    CHECK(default_inline(send_lat, true, 512) == 236);
    CHECK(default_inline(send_lat, true, 128) == 128);
    CHECK(default_inline(write_lat, false, 512) == 512);
    CHECK(default_inline({Verb::read, Measure::latency}, false, 512) == 0);
    CHECK(default_inline({Verb::atomic, Measure::latency}, true, 512) == 0);
    CHECK(default_inline({Verb::write, Measure::bandwidth}, true, 512) == 0);
}

TEST_CASE("perf protocol: a request carries the run's parameters to the server") {
    const Options client = must(parse({"send_bw", "h", "-q", "3", "-l", "4", "-t", "64", "-r", "99", "-Q", "7", "-I",
                                       "32", "-m", "512", "-a", "-R"}));
    Options server = must(parse({"send_bw", "-R"}));
    must(protocol::decode_request(protocol::encode_request(client), server));
    CHECK(server.qps == 3);
    CHECK(server.post_list == 4);
    CHECK(server.tx_depth == 64);
    CHECK(server.rx_depth == 99);
    CHECK(server.cq_mod == 7);
    CHECK(server.inline_size == 32u);
    CHECK(server.mtu == Mtu::b512);
    CHECK(server.sizes == std::vector<std::uint32_t>{8u << 20}); // the largest: what the server allocates
    CHECK(server.host.empty());

    Options plain = must(parse({"atomic_lat", "-A", "CMP_AND_SWAP"}));
    Options served = must(parse({"atomic_lat"}));
    must(protocol::decode_request(protocol::encode_request(plain), served));
    CHECK_FALSE(served.inline_size);
    CHECK_FALSE(served.mtu);
    CHECK(served.atomic == AtomicOp::compare_swap);
}

TEST_CASE("perf protocol: a malformed or mismatched request is refused with the reason") {
    const Options client = must(parse({"write_bw", "h"}));
    Options server = must(parse({"write_bw"}));
    const auto good = protocol::encode_request(client);
    const auto refused = [&](auto mutate, std::string_view why) {
        auto bytes = good;
        mutate(bytes);
        Options target = server;
        expect_malformed(protocol::decode_request(bytes, target), why);
    };
    refused([](auto& b) { b[0] = std::byte{'X'}; }, "bad magic");
    refused([](auto& b) { b[5] = std::byte{9}; }, "version 9");
    refused([](auto& b) { b[6] = std::byte{5}; }, "out of range");     // verb
    refused([](auto& b) { b[11] = std::byte{0}; }, "out of range");    // 0 QPs
    refused([](auto& b) { b[13] = std::byte{3}; }, "out of range");    // post list 3 does not divide 128
    refused([](auto& b) { b[14] = std::byte{6}; }, "out of range");    // MTU
    refused([](auto& b) { b[32] = std::byte{1}; }, "out of range");    // a 16 MiB message
    refused([](auto& b) { b[39] = std::byte{1}; }, "out of range");    // reserved
    refused([](auto& b) { b[6] = std::byte{1}; }, "the client runs read_bw, this server write_bw");
    refused([](auto& b) { b[9] = std::byte{1}; }, "over RDMA CM, this server over TCP");
    Options target = server;
    expect_malformed(protocol::decode_request(std::span(good).first(39), target), "a request of 39 bytes");
}

TEST_CASE("perf protocol: commands and replies round-trip; malformed ones are errors") {
    const Test bw{Verb::write, Measure::bandwidth};
    const protocol::Command run{protocol::CommandKind::run, 4096, 1000};
    CHECK(must(protocol::decode_command(protocol::encode_command(run), bw, 8u << 20)) == run);
    const protocol::Command finish{protocol::CommandKind::finish, 0, 0};
    CHECK(must(protocol::decode_command(protocol::encode_command(finish), bw, 8u << 20)) == finish);
    auto wire = protocol::encode_command(run);
    wire[0] = std::byte{7};
    CHECK(must_fail(protocol::decode_command(wire, bw, 8u << 20)).kind() == Error::Kind::protocol);
    CHECK(must_fail(protocol::decode_command(protocol::encode_command({protocol::CommandKind::run, 9u << 20, 10}), bw, 8u << 20))
              .kind() == Error::Kind::protocol);
    CHECK(must_fail(protocol::decode_command(protocol::encode_command({protocol::CommandKind::run, 64, 4}), bw, 8u << 20))
              .kind() == Error::Kind::protocol);
    const Test atomic{Verb::atomic, Measure::latency};
    CHECK(must_fail(protocol::decode_command(protocol::encode_command(run), atomic, 8)).kind() == Error::Kind::protocol);
    // a run above the size the client announced (the server's memory holds no more: it aborted)
    CHECK(must(protocol::decode_command(protocol::encode_command(run), bw, 4096)) == run);
    CHECK(must_fail(protocol::decode_command(protocol::encode_command(run), bw, 4095)).message().find(
              "above the 4095 B announced") != std::string::npos);

    const protocol::Reply mismatch{protocol::ReplyKind::mismatch, "QP 0: byte 3 of 64"};
    CHECK(must(protocol::decode_reply(protocol::encode_reply(mismatch))) == mismatch);
    const protocol::Reply longer{protocol::ReplyKind::refused, std::string(300, 'x')};
    CHECK(must(protocol::decode_reply(protocol::encode_reply(longer))).reason == std::string(200, 'x'));
    auto reply = protocol::encode_reply(mismatch);
    reply[4] = std::byte{0x07}; // a control character from the peer is not printed as is
    CHECK(must(protocol::decode_reply(reply)).reason.front() == '?');
    reply[2] = std::byte{1}; // 256 + ... bytes of reason
    CHECK(must_fail(protocol::decode_reply(reply)).kind() == Error::Kind::protocol);
    CHECK(must_fail(protocol::decode_reply(std::span(reply).first(10))).kind() == Error::Kind::protocol);
}

TEST_CASE("perf statistics: perftest's latency figures") {
    // gaps of 1..100 us and two outliers (the two largest samples are dropped)
    std::vector<Clock::time_point> stamps{Clock::time_point{}};
    for (int gap = 1; gap <= 100; ++gap)
        stamps.push_back(stamps.back() + std::chrono::microseconds(gap * 2));
    stamps.push_back(stamps.back() + std::chrono::milliseconds(50));
    stamps.push_back(stamps.back() + std::chrono::milliseconds(70));
    const Latency l = summarize_latency(stamps, 2); // a ping-pong: halved
    CHECK(l.t_min == doctest::Approx(1));
    CHECK(l.t_max == doctest::Approx(100));
    CHECK(l.t_typical == doctest::Approx(50.5)); // the mean of the middle two of 1..100 (perftest's); 51 was one-sided
    const std::vector<Clock::time_point> odd{stamps.begin(), stamps.begin() + 6}; // gaps 1..5, 2 dropped
    CHECK(summarize_latency(odd, 2).t_typical == doctest::Approx(2));            // the middle of 1..3
    CHECK(l.t_avg == doctest::Approx(50.5));
    CHECK(l.t_stdev == doctest::Approx(28.866).epsilon(0.001));
    CHECK(l.p99 == doctest::Approx(100));  // sorted[ceil(0.99 * 100)], clamped
    const Latency whole = summarize_latency(stamps, 1);
    CHECK(whole.t_min == doctest::Approx(2));
    CHECK(summarize_latency(std::span(stamps).first(1), 1).t_max == 0); // no samples: zeros, not a crash
}

TEST_CASE("perf statistics: bandwidth in Gb/s, MiB/s and Mpps") {
    const Bandwidth b = bandwidth(65536, 1000, std::chrono::milliseconds(500));
    CHECK(b.gbit_per_s == doctest::Approx(65536.0 * 1000 * 8 / 0.5 / 1e9));
    CHECK(b.mib_per_s == doctest::Approx(125.0));
    CHECK(b.mpps == doctest::Approx(0.002));
    CHECK(bandwidth(64, 10, Clock::duration::zero()).gbit_per_s == 0);
}

TEST_CASE("perf report: perftest's table and one JSON object per line") {
    const Setup setup{.test = {Verb::write, Measure::latency}, .device = "rxe0", .tx_depth = 128, .inline_size = 220,
                      .mtu_bytes = 1024};
    const std::string head = table_head(setup);
    CHECK(head.find("RDMA_Write Latency Test") != std::string::npos);
    CHECK(head.find("t_typical[usec]") != std::string::npos);
    CHECK(head.find("Max inline data: 220[B]") != std::string::npos);
    const Latency l{.t_min = 1.5, .t_max = 9, .t_typical = 2.25, .t_avg = 2.5, .t_stdev = 0.5, .p99 = 8, .p999 = 9};
    CHECK(latency_row(8388608, 1000, l).starts_with(" 8388608  1000"));
    const std::string json = latency_json(setup, 64, 1000, l);
    CHECK(json.find("\"test\":\"write_lat\"") != std::string::npos);
    CHECK(json.find("\"size\":64,\"iters\":1000,\"t_min\":1.500") != std::string::npos);
    CHECK(json.find("\"t_typical\":2.250") != std::string::npos);
    CHECK(json.ends_with("}\n"));
    const Setup bw_setup{.test = {Verb::atomic, Measure::bandwidth}, .atomic = AtomicOp::compare_swap, .device = "x"};
    CHECK(table_head(bw_setup).find("Atomic CMP_AND_SWAP BW Test") != std::string::npos);
    const std::string bw = bandwidth_json(bw_setup, 8, 5000, {.gbit_per_s = 1, .mib_per_s = 119.2, .mpps = 2});
    CHECK(bw.find("\"atomic\":\"compare_swap\"") != std::string::npos);
    CHECK(bw.find("\"mib_per_s\":119.2000") != std::string::npos);
}
