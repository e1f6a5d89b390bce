#include "protocol.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <rdmaxx/wrap/wire.hpp>

namespace rdmaxx::perf::protocol {
namespace {

constexpr std::array<std::byte, 4> magic{std::byte{'R'}, std::byte{'X'}, std::byte{'P'}, std::byte{'F'}};
constexpr std::uint32_t no_inline = 0xffffffff; // the default: each side picks for its device

Error malformed(std::string detail) { return Error::protocol("peer", std::move(detail)); }

Result<void> check_size(std::span<const std::byte> bytes, std::size_t wanted, std::string_view what) {
    if (bytes.size() != wanted)
        return std::unexpected(malformed(fmt::format("a {} of {} bytes (expected {})", what, bytes.size(), wanted)));
    return {};
}

} // namespace

// offset: 0 magic, 4 version, 6 verb, 7 measure, 8 atomic, 9 rdma_cm, 10 qps, 12 post_list,
// 14 mtu (0: default), 15 reserved, 16 tx_depth, 20 rx_depth, 24 cq_mod, 28 inline, 32 largest
// size, 36 reserved
RequestWire encode_request(const Options& o) {
    RequestWire w{};
    std::copy(magic.begin(), magic.end(), w.begin());
    wire::put(&w[4], version, 2);
    w[6] = static_cast<std::byte>(o.test.verb);
    w[7] = static_cast<std::byte>(o.test.measure);
    w[8] = static_cast<std::byte>(o.atomic);
    w[9] = static_cast<std::byte>(o.rdma_cm);
    wire::put(&w[10], o.qps, 2);
    wire::put(&w[12], o.post_list, 2);
    w[14] = static_cast<std::byte>(o.mtu.value_or(Mtu::unknown));
    wire::put(&w[16], o.tx_depth, 4);
    wire::put(&w[20], o.rx_depth, 4);
    wire::put(&w[24], o.cq_mod, 4);
    wire::put(&w[28], o.inline_size.value_or(no_inline), 4);
    wire::put(&w[32], *std::max_element(o.sizes.begin(), o.sizes.end()), 4);
    return w;
}

Result<void> decode_request(std::span<const std::byte> b, Options& into) {
    if (auto ok = check_size(b, request_size, "request"); !ok)
        return ok;
    if (!std::equal(magic.begin(), magic.end(), b.begin()))
        return std::unexpected(malformed("not an rdmaxx-perf client (bad magic)"));
    if (const auto v = wire::get(&b[4], 2); v != version)
        return std::unexpected(malformed(fmt::format("client speaks version {}, this server {}", v, version)));
    const auto field = [&](std::size_t at, int bytes) { return static_cast<std::uint32_t>(wire::get(&b[at], bytes)); };
    const auto in = [](std::uint32_t v, std::uint32_t low, std::uint32_t high) { return v >= low && v <= high; };
    Options o = into;
    const std::uint32_t verb = field(6, 1), measure = field(7, 1), atomic = field(8, 1), cm = field(9, 1);
    const std::uint32_t mtu = field(14, 1), inline_size = field(28, 4), largest = field(32, 4);
    o.qps = field(10, 2);
    o.post_list = field(12, 2);
    o.tx_depth = field(16, 4);
    o.rx_depth = field(20, 4);
    o.cq_mod = field(24, 4);
    if (verb > static_cast<std::uint32_t>(Verb::atomic) || measure > 1 || atomic > 1 || cm > 1 || mtu > 5 ||
        !in(o.qps, 1, max_qps) || !in(o.post_list, 1, max_post_list) || !in(o.tx_depth, 1, 16384) ||
        o.tx_depth % o.post_list != 0 || !in(o.rx_depth, 1, 16384) || !in(o.cq_mod, 1, 16384) ||
        (inline_size != no_inline && inline_size > 16384) || !in(largest, min_size, max_size) ||
        field(15, 1) != 0 || field(36, 4) != 0)
        return std::unexpected(malformed("a request with a field out of range"));
    const Test test{static_cast<Verb>(verb), static_cast<Measure>(measure)};
    if (test != into.test)
        return std::unexpected(malformed(fmt::format("the client runs {}, this server {}", test_name(test),
                                                     test_name(into.test))));
    if (static_cast<bool>(cm) != into.rdma_cm)
        return std::unexpected(malformed(fmt::format("the client connects over {}, this server over {}",
                                                     cm ? "RDMA CM" : "TCP", into.rdma_cm ? "RDMA CM" : "TCP")));
    o.atomic = static_cast<AtomicOp>(atomic);
    o.mtu = mtu == 0 ? std::nullopt : std::optional(static_cast<Mtu>(mtu));
    o.inline_size = inline_size == no_inline ? std::nullopt : std::optional(inline_size);
    o.sizes = {largest};
    into = std::move(o);
    return {};
}

CommandWire encode_command(const Command& c) {
    CommandWire w{};
    w[0] = static_cast<std::byte>(c.kind);
    wire::put(&w[4], c.size, 4);
    wire::put(&w[8], c.iters, 4);
    return w;
}

Result<Command> decode_command(std::span<const std::byte> b, Test test, std::uint32_t largest) {
    if (auto ok = check_size(b, command_size, "command"); !ok)
        return std::unexpected(ok.error());
    const auto kind = static_cast<std::uint8_t>(b[0]);
    if (kind < 1 || kind > 3 || b[1] != std::byte{0} || b[2] != std::byte{0} || b[3] != std::byte{0})
        return std::unexpected(malformed(fmt::format("a command of kind {}", kind)));
    const Command c{static_cast<CommandKind>(kind), static_cast<std::uint32_t>(wire::get(&b[4], 4)),
                    static_cast<std::uint32_t>(wire::get(&b[8], 4))};
    if (c.kind != CommandKind::run)
        return c;
    const bool size_ok = test.verb == Verb::atomic ? c.size == atomic_size : c.size >= min_size && c.size <= max_size;
    if (!size_ok || c.iters < 5 || c.iters > 100'000'000)
        return std::unexpected(malformed(fmt::format("a run of {} x {} B", c.iters, c.size)));
    if (c.size > largest)
        return std::unexpected(malformed(fmt::format("a run of {} B, above the {} B announced", c.size, largest)));
    return c;
}

// 0 kind, 1 reserved, 2 reason length, 4 reason
ReplyWire encode_reply(const Reply& r) {
    ReplyWire w{};
    w[0] = static_cast<std::byte>(r.kind);
    const std::size_t n = std::min(r.reason.size(), max_reason);
    wire::put(&w[2], n, 2);
    std::transform(r.reason.begin(), r.reason.begin() + static_cast<std::ptrdiff_t>(n), w.begin() + 4,
                   [](char c) { return static_cast<std::byte>(c); });
    return w;
}

Result<Reply> decode_reply(std::span<const std::byte> b) {
    if (auto ok = check_size(b, reply_size, "reply"); !ok)
        return std::unexpected(ok.error());
    const auto kind = static_cast<std::uint8_t>(b[0]);
    const auto n = wire::get(&b[2], 2);
    if (kind < 1 || kind > 5 || b[1] != std::byte{0} || n > max_reason)
        return std::unexpected(malformed(fmt::format("a reply of kind {} with {} bytes of reason", kind, n)));
    Reply r{static_cast<ReplyKind>(kind), {}};
    for (std::size_t i = 0; i < n; ++i) {
        const auto c = static_cast<unsigned char>(b[4 + i]);
        r.reason.push_back(c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?'); // the peer's text: printable only
    }
    return r;
}

} // namespace rdmaxx::perf::protocol
