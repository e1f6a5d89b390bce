// libFuzzer target: a session's two windows (slots.hpp) between an honest client and an
// honest server, with hostile packets (any bytes decode() accepts) thrown at either end
// among the honest ones, calls abandoned, requests sent whole (their SENDs completing),
// responses WRITTEN over the RC path (real or forged), and time moving. Whatever the peer sends is dropped or taken: never an
// abort (the windows' preconditions are programming errors, which only their driver
// can commit: this one keeps them), nor memory out of bounds (ASan watches), nor more
// packets in flight than the session's credits, nor a credit lost.
//
// The input is a program: each byte picks an operation, the bytes after it are its
// operands (missing operands read as 0).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <span>
#include <vector>

#include "packet.hpp"
#include "slots.hpp"

namespace {

namespace rpc = rdmaxx::rpc::detail;

constexpr std::uint32_t window = 4, credits = 6;
// MTU 256: a message of a few hundred bytes spans several packets, or goes whole
const rpc::PacketLimits limits(4096, 256 - rpc::header_bytes, 4096);
const rpc::Route client_route{.local = {.number = 1, .generation = 7}, .remote = {.number = 2, .generation = 9}};
const rpc::Route server_route{.local = client_route.remote, .remote = client_route.local};

class Program {
public:
    explicit Program(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}
    bool done() const noexcept { return at_ >= bytes_.size(); }
    std::uint32_t next(unsigned width = 1) {
        std::uint32_t v = 0;
        for (unsigned i = 0; i < width; ++i)
            v = v << 8 | (at_ < bytes_.size() ? bytes_[at_++] : 0);
        return v;
    }
    // Up to `most` of the next bytes, as they are.
    std::span<const std::byte> take(std::size_t most) {
        const std::size_t n = std::min(most, bytes_.size() - std::min(at_, bytes_.size()));
        const auto out = std::as_bytes(bytes_.subspan(at_, n));
        at_ += n;
        return out;
    }

private:
    std::span<const std::uint8_t> bytes_;
    std::size_t at_ = 0;
};

struct Pending {
    std::uint64_t request;
    bool rdma;
};

struct Session {
    rpc::ClientWindow client{rpc::ClientOptions{.window = window, .credits = credits}, limits, client_route};
    rpc::ServerWindow server{window, limits, server_route};
    rpc::Clock::time_point now{};
    std::vector<std::uint64_t> live;      // calls begun, not ended or abandoned
    std::vector<Pending> pending;         // requests whose handler has not answered
    std::vector<std::byte> scratch;

    void ended(std::uint64_t request) { std::erase(live, request); }

    // The client takes packet `bytes` (whole: header and payload).
    void to_client(std::span<const std::byte> bytes) {
        const auto header = rpc::decode(bytes, limits);
        if (!header)
            return;
        const auto got = client.receive(*header, bytes.subspan(rpc::header_bytes), now);
        if (got && *got)
            ended((*got)->request);
    }
    void to_client(const rpc::Outgoing& out) { to_client(frame(out)); }

    // The server takes packet `bytes`; what it answers goes to the client.
    void to_server(std::span<const std::byte> bytes) {
        const auto header = rpc::decode(bytes, limits);
        if (!header)
            return;
        const auto step = server.receive(*header, bytes.subspan(rpc::header_bytes));
        if (!step)
            return;
        if (const auto* out = std::get_if<rpc::Outgoing>(&*step))
            return to_client(*out);
        const auto& call = std::get<rpc::HandlerCall>(*step);
        if (call.lent) // the packet goes with this function
            (void)server.keep(call.request, call.message);
        pending.push_back({call.request, call.rdma});
    }

    std::vector<std::byte> frame(const rpc::Outgoing& out) {
        std::vector<std::byte> bytes(rpc::header_bytes);
        rpc::encode(out.header, std::span(bytes).first<rpc::header_bytes>());
        bytes.insert(bytes.end(), out.payload.begin(), out.payload.end());
        return bytes;
    }

    void step(Program& p) {
        switch (p.next() % 8) {
        case 0: { // the client begins a call
            const std::uint32_t size = p.next(2) % (limits.max_message() + 1);
            const std::uint32_t capacity = p.next(2);
            const std::uint32_t form = p.next();
            const bool rdma = form & 1, whole = rdma && (form & 2);
            scratch.assign(size, std::byte{0x5a});
            if (const auto begun = client.begin(3, scratch, capacity, rdma, rpc::ClientWindow::Keep::copy, whole))
                live.push_back(*begun);
            break;
        }
        case 1: // what the client may send reaches the server
            while (const auto out = client.next_packet(now)) {
                const auto bytes = frame(*out);
                if (!rpc::decode(bytes, limits))
                    std::abort(); // an honest client's packet
                to_server(bytes);
            }
            break;
        case 2: { // a forged packet to the server
            const std::size_t n = p.next(2) % 512;
            to_server(p.take(n));
            break;
        }
        case 3: { // a forged packet to the client
            const std::size_t n = p.next(2) % 512;
            to_client(p.take(n));
            break;
        }
        case 4: { // a handler answers
            if (pending.empty())
                break;
            const Pending call = pending[p.next() % pending.size()];
            std::erase_if(pending, [&](const Pending& q) { return q.request == call.request; });
            if (!server.awaiting(call.request))
                break;
            constexpr rpc::Status statuses[] = {rpc::Status::ok, rpc::Status::no_handler, rpc::Status::too_large,
                                                rpc::Status::handler_dropped, rpc::Status::transfer_failed};
            const rpc::Status status = statuses[p.next() % std::size(statuses)];
            const bool rdma = call.rdma && status == rpc::Status::ok && (p.next() & 1);
            scratch.assign(status == rpc::Status::ok ? (rdma ? 4 : p.next(2) % 6000) : 0, std::byte{0x33});
            to_client(server.respond(call.request, status, scratch, rdma));
            break;
        }
        case 5: // time passes: RTOs expire
            now += std::chrono::milliseconds(p.next(2));
            while (const auto end = client.expire(now))
                ended(end->request);
            break;
        case 6: // the client's caller goes away
            if (!live.empty()) {
                const std::uint64_t request = live[p.next() % live.size()];
                client.abandon(request);
                ended(request);
            }
            break;
        case 7: { // over the RC path, to a call of the client's or any: a whole request's SEND
                  // complete, or a response WRITTEN
            const std::uint64_t request = !live.empty() && (p.next() & 1) ? live[p.next() % live.size()] : p.next(4);
            if (p.next() & 1) {
                client.delivered(request);
                break;
            }
            const std::byte descriptor[4] = {};
            if (const auto end = client.written(request, descriptor, now))
                ended(end->request);
            break;
        }
        }
        // credits are never overdrawn, and none is lost: with no call left, none is out
        if (client.in_flight() > credits || (live.empty() && client.in_flight() != 0))
            std::abort();
    }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    Program program(std::span(data, size));
    Session session;
    for (int steps = 0; !program.done() && steps < 256; ++steps)
        session.step(program);
    return 0;
}
