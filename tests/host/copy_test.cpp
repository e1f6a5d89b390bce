// rdmaxx-copy's pure logic: its protocol codec (every message round-trips; anything
// malformed is a protocol Error; random corruption never reads outside the bytes),
// the destination rules (on a real directory tree: symlinks out, "..", absolute),
// its command line and its output.
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include "checksum.hpp"
#include "options.hpp"
#include "paths.hpp"
#include "protocol.hpp"
#include "report.hpp"

#include "../support/check.hpp"

using namespace rdmaxx;
using namespace rdmaxx::copy;
using rdmaxx::test::must;
using rdmaxx::test::must_fail;

namespace {

std::vector<Message> samples() {
    return {Hello{.block = 1 << 20, .depth = 4, .files = 3, .total_bytes = 1ull << 40},
            Ready{},
            File{.size = 4097, .mode = 0644, .flags = file_into_directory, .target = "sub/dir/", .name = "a.bin"},
            File{},
            FileOk{},
            Ack{.through = 0xfffffffe},
            Done{.checksum = 0x0123456789abcdef},
            FileResult{.code = 0, .text = "sub/a.bin"},
            FileResult{.code = EBADMSG, .text = std::string(max_text, 'x')},
            // the longest name a stored file can have: its result's text
            FileResult{.code = 0, .text = std::string(max_target + 1 + max_name, 'n')},
            SessionError{.code = ENOSPC, .text = "writing"}};
}

std::vector<std::byte> encoded(const Message& m) {
    std::vector<std::byte> out;
    encode(m, out);
    return out;
}

void check_protocol(const Result<Message>& r, std::string_view says) {
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().kind() == Error::Kind::protocol);
    CHECK_MESSAGE(r.error().message().find(says) != std::string::npos, r.error().message());
}

// A scratch directory tree, removed afterwards.
struct Tree {
    std::filesystem::path root;
    std::filesystem::path outside;
    Fd fd;
    Tree() {
        char pattern[] = "/tmp/rdmaxx-copy-host.XXXXXX";
        REQUIRE(::mkdtemp(pattern) != nullptr);
        root = std::filesystem::path(pattern) / "served";
        outside = std::filesystem::path(pattern) / "outside";
        std::filesystem::create_directories(root / "sub" / "deeper");
        std::filesystem::create_directories(outside);
        std::filesystem::create_symlink(outside, root / "out");
        std::filesystem::create_symlink(root / "sub", root / "inner-link");
        std::filesystem::create_symlink(outside / "nothing", root / "dangling");
        ::close(::open((root / "file").c_str(), O_CREAT | O_WRONLY, 0644));
        ::mkfifo((root / "fifo").c_str(), 0644);
        fd = Fd(::open(root.c_str(), O_RDONLY | O_DIRECTORY));
        REQUIRE(fd);
    }
    ~Tree() { std::filesystem::remove_all(root.parent_path()); }
};

Result<Options> parse(std::vector<std::string_view> args) { return parse_options(args); }

} // namespace

TEST_CASE("copy protocol: every message round-trips, byte for byte") {
    for (const Message& m : samples()) {
        const auto bytes = encoded(m);
        CHECK(bytes.size() <= max_message);
        const Message back = must(decode(bytes));
        CHECK(back == m);
        CHECK(encoded(back) == bytes);
    }
}

TEST_CASE("copy protocol: a wrong header, size or field is a protocol error") {
    auto hello = encoded(Hello{.block = 4096, .depth = 1, .files = 1, .total_bytes = 0});
    check_protocol(decode(std::span(hello).first(5)), "shorter than a header");
    check_protocol(decode({}), "shorter than a header");
    auto bad = hello;
    bad[0] = std::byte{'X'};
    check_protocol(decode(bad), "magic");
    bad = hello;
    bad[4] = std::byte{2};
    check_protocol(decode(bad), "version 2");
    bad = hello;
    bad[5] = std::byte{99};
    check_protocol(decode(bad), "unknown message type 99");
    bad = hello;
    bad[7] = std::byte{1};
    check_protocol(decode(bad), "reserved");
    bad = hello;
    bad.push_back(std::byte{0});
    check_protocol(decode(bad), "wrong size");
    check_protocol(decode(std::span(hello).first(hello.size() - 1)), "wrong size");
    std::vector<std::byte> huge(max_message + 1);
    check_protocol(decode(huge), "at most");

    auto file = encoded(File{.size = 1, .mode = 0, .flags = 0, .target = "t", .name = "n"});
    bad = file;
    bad[8 + 12] = std::byte{0x80}; // flags
    check_protocol(decode(bad), "unknown flags");
    bad = file;
    bad[8 + 13] = std::byte{0xff}; // target length 0xff01: beyond max_target
    check_protocol(decode(bad), "too long");
    bad = file;
    bad[8 + 16] = std::byte{9}; // name length 9: past the end
    check_protocol(decode(bad), "wrong size");

    auto error = encoded(SessionError{.code = 1, .text = "x"});
    bad = error;
    bad[11] = std::byte{0}; // code 0
    check_protocol(decode(bad), "code 0");
    bad = error;
    bad[12] = std::byte{0x7f}; // text length beyond max_text
    check_protocol(decode(bad), "at most");
}

TEST_CASE("copy protocol: random corruption is decoded or refused, never read past the end") {
    std::mt19937_64 random(17);
    for (int round = 0; round < 20000; ++round) {
        const auto all = samples();
        auto bytes = encoded(all[random() % all.size()]);
        const int flips = 1 + static_cast<int>(random() % 4);
        for (int i = 0; i < flips; ++i)
            bytes[random() % bytes.size()] ^= static_cast<std::byte>(1u << (random() % 8));
        if (random() % 4 == 0)
            bytes.resize(random() % (bytes.size() + 1));
        // an exact-size copy: a read past the end is ASan's to report
        const std::vector<std::byte> exact(bytes);
        if (auto m = decode(exact))
            CHECK(encoded(*m) == exact);
        else
            CHECK(m.error().kind() == Error::Kind::protocol);
    }
}

TEST_CASE("copy protocol: the transfer's shape is bounded") {
    CHECK(check_hello({.block = 4096, .depth = 1, .files = 1, .total_bytes = 0}));
    CHECK(check_hello({.block = 16 << 20, .depth = 4, .files = 1, .total_bytes = 0}));
    CHECK_FALSE(check_hello({.block = 4095, .depth = 1, .files = 1, .total_bytes = 0}));
    CHECK_FALSE(check_hello({.block = (16 << 20) + 1, .depth = 1, .files = 1, .total_bytes = 0}));
    CHECK_FALSE(check_hello({.block = 4096, .depth = 0, .files = 1, .total_bytes = 0}));
    CHECK_FALSE(check_hello({.block = 4096, .depth = 65, .files = 1, .total_bytes = 0}));
    CHECK_FALSE(check_hello({.block = 16 << 20, .depth = 5, .files = 1, .total_bytes = 0}));
    CHECK_FALSE(check_hello({.block = 4096, .depth = 1, .files = 0, .total_bytes = 0}));
    CHECK(must(chunk_count(0, 4096)) == 0);
    CHECK(must(chunk_count(1, 4096)) == 1);
    CHECK(must(chunk_count(4097, 4096)) == 2);
    CHECK(must(chunk_count(8192, 4096)) == 2);
    CHECK(must_fail(chunk_count(4096ull << 32, 4096)).is_errno(EFBIG));
}

TEST_CASE("copy paths: the text rules") {
    CHECK(must(split_destination("")).components.empty());
    const auto split = must(split_destination("a/b/c/"));
    CHECK(split.components == std::vector<std::string>{"a", "b", "c"});
    CHECK(split.directory);
    CHECK_FALSE(must(split_destination("a.b/..c")).directory);
    CHECK(must_fail(split_destination("/etc/passwd")).is_errno(EACCES));
    CHECK(must_fail(split_destination("..")).is_errno(EACCES));
    CHECK(must_fail(split_destination("a/../../b")).is_errno(EACCES));
    CHECK(must_fail(split_destination("a//b")).is_errno(EINVAL));
    CHECK(must_fail(split_destination("./a")).is_errno(EINVAL));
    CHECK(must_fail(split_destination("/")).is_errno(EACCES));
    CHECK(must_fail(split_destination(std::string_view("a\0b", 3))).is_errno(EINVAL));
    CHECK(must_fail(split_destination(std::string(max_target + 1, 'a'))).is_errno(ENAMETOOLONG));
    CHECK(must_fail(split_destination(std::string(256, 'a'))).is_errno(ENAMETOOLONG));
    CHECK(check_file_name(".hidden"));
    CHECK_FALSE(check_file_name(""));
    CHECK_FALSE(check_file_name("."));
    CHECK_FALSE(check_file_name(".."));
    CHECK_FALSE(check_file_name("a/b"));
    CHECK_FALSE(check_file_name(std::string_view("a\0", 2)));
    const std::string temp = temporary_name(std::string(255, 'n'), 0xabcdef);
    CHECK(temp.size() <= 255);
    CHECK(temp.starts_with(".nnn"));
    CHECK(temp.ends_with(".rdmaxx-abcdef"));
}

TEST_CASE("copy paths: destinations on a real tree, never outside it") {
    Tree t;
    const int root = t.fd.get();
    auto d = must(resolve(root, "", "a.bin", false));
    CHECK(d.name == "a.bin");
    CHECK(d.shown == "a.bin");
    d = must(resolve(root, "sub", "a.bin", false));
    CHECK(d.shown == "sub/a.bin");
    d = must(resolve(root, "sub/deeper/", "a.bin", true));
    CHECK(d.shown == "sub/deeper/a.bin");
    d = must(resolve(root, "sub/new-name", "a.bin", false));
    CHECK(d.name == "new-name");
    CHECK(d.shown == "sub/new-name");
    d = must(resolve(root, "file", "a.bin", false)); // an existing file: replaced
    CHECK(d.shown == "file");

    CHECK(must_fail(resolve(root, "file", "a.bin", true)).is_errno(ENOTDIR));   // several files
    CHECK(must_fail(resolve(root, "file/", "a.bin", false)).is_errno(ENOTDIR));
    CHECK(must_fail(resolve(root, "new-dir/", "a.bin", false)).is_errno(ENOENT));
    CHECK(must_fail(resolve(root, "missing/x", "a.bin", false)).is_errno(ENOENT));
    CHECK(must_fail(resolve(root, "file/x", "a.bin", false)).is_errno(ENOTDIR));
    CHECK(must_fail(resolve(root, "", "sub", false)).is_errno(EISDIR));         // a directory in the way
    CHECK(must_fail(resolve(root, "", "fifo", false)).is_errno(EINVAL));
    CHECK(must_fail(resolve(root, "fifo", "a.bin", false)).is_errno(EINVAL));
    // links: out of the tree or not, followed nowhere, replaced never
    for (const char* target : {"out", "out/", "out/x", "inner-link", "inner-link/x", "dangling"})
        CHECK_MESSAGE(must_fail(resolve(root, target, "a.bin", false)).is_errno(EACCES), target);
    CHECK(must_fail(resolve(root, "", "out", false)).is_errno(EACCES));
    CHECK(must_fail(resolve(root, "../outside", "a.bin", false)).is_errno(EACCES));
    CHECK(must_fail(resolve(root, t.outside.string(), "a.bin", false)).is_errno(EACCES));
    CHECK(must_fail(resolve(root, "", "../a.bin", false)).is_errno(EACCES));
    CHECK(std::filesystem::is_empty(t.outside));
}

TEST_CASE("copy options: client, server, sizes and what is refused") {
    auto o = must(parse({"-b", "64K", "--depth=8", "--json", "a", "b", "10.0.0.1:dir/"}));
    CHECK(o.block == 64 << 10);
    CHECK(o.depth == 8);
    CHECK(o.json);
    CHECK(o.files == std::vector<std::string>{"a", "b"});
    CHECK(o.host == "10.0.0.1");
    CHECK(o.target == "dir/");
    CHECK(o.port == default_port);
    o = must(parse({"--serve", "/srv", "--once", "-R", "-p", "9000", "--timeout", "5", "-d", "rxe0", "--max-clients",
                    "3"}));
    CHECK(*o.serve == "/srv");
    CHECK(o.max_clients == 3);
    CHECK(o.once);
    CHECK(o.rdma_cm);
    CHECK(o.port == 9000);
    CHECK(o.timeout == std::chrono::seconds(5));
    CHECK(o.device == "rxe0");
    o = must(parse({"--", "-odd-name", "[fe80::1]:"}));
    CHECK(o.files == std::vector<std::string>{"-odd-name"});
    CHECK(o.host == "fe80::1");
    CHECK(o.target.empty());
    CHECK(must(parse({"-h"})).help);
    // a destination longer than the protocol carries is refused, never cut short
    const std::string longest = "h:" + std::string(max_target, 'd');
    CHECK(must(parse({"a", longest})).target.size() == max_target);
    const std::string too_long = longest + "d";
    const auto refused = parse({"a", too_long});
    REQUIRE_FALSE(refused);
    CHECK(refused.error().is_errno(EINVAL));

    for (const auto& bad : std::vector<std::vector<std::string_view>>{
             {"a"}, {"a", "nohost"}, {"a", ":path"}, {"--serve"}, {"--serve", "d", "file"}, {"--once", "a", "h:"},
             {"-b", "1K", "a", "h:"}, {"-b", "32M", "a", "h:"}, {"--depth", "0", "a", "h:"}, {"--depth", "65", "a", "h:"},
             {"-b", "16M", "--depth", "8", "a", "h:"}, {"-p", "0", "a", "h:"}, {"--timeout", "0", "a", "h:"},
             {"--bogus", "a", "h:"}, {"--serve", "d", "--max-clients", "0"}, {"--serve", "d", "--max-clients", "1025"}}) {
        const auto r = parse(bad);
        CHECK_MESSAGE(!r, fmt::format("{}", fmt::join(bad, " ")));
        if (!r)
            CHECK(r.error().is_errno(EINVAL));
    }
    CHECK(*parse_size("4096") == 4096);
    CHECK(*parse_size("1M") == 1 << 20);
    CHECK(*parse_size("1MiB") == 1 << 20);
    CHECK(*parse_size("2k") == 2048);
    CHECK_FALSE(parse_size("M"));
    CHECK_FALSE(parse_size("1.5M"));
    CHECK_FALSE(parse_size("99999999999999999999G"));
    const std::string_view man = manual();
    for (const char* section : {"SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "EXAMPLES"})
        CHECK(man.find(section) != std::string_view::npos);
}

TEST_CASE("copy output: lines, JSON, ETA; the checksum is XXH64") {
    const FileReport ok{.file = "a \"b\"\n", .stored_as = "x", .bytes = 1 << 20, .seconds = 0.5, .ok = true, .error = {}};
    CHECK(json_line(ok) == R"({"file": "a \"b\"\n", "ok": true, "bytes": 1048576, "seconds": 0.500000, )"
                           R"("mib_per_s": 2.000, "stored_as": "x"})");
    CHECK(summary_line(ok).find("2.0 MiB/s") != std::string::npos);
    CHECK(json_total(2, 1, 10, 1.0).find(R"("failed": 1)") != std::string::npos);
    CHECK(json_escape(std::string("\x01", 1)) == "\\u0001");
    CHECK(format_eta(61) == "1:01");
    CHECK(format_eta(3661) == "1:01:01");
    CHECK(format_eta(-1) == "--:--");
    CHECK(progress_line("f", 50, 100, 1.0).find(" 50.0%") != std::string::npos);
    // XXH64's published value for no input, and streaming equals one shot
    CHECK(checksum_of({}) == 0xef46db3751d8e999ull);
    std::vector<std::byte> bytes(100'000);
    for (std::size_t i = 0; i < bytes.size(); ++i)
        bytes[i] = static_cast<std::byte>(i * 31);
    Checksum streamed;
    streamed.update(std::span(bytes).first(4097));
    streamed.update(std::span(bytes).subspan(4097));
    CHECK(streamed.digest() == checksum_of(bytes));
}
