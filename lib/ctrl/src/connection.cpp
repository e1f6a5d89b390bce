#include <rdmaxx/ctrl/connection.hpp>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <unordered_map>
#include <vector>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include <rdmaxx/data/post.hpp>
#include <rdmaxx/wrap/log.hpp>
#include <rdmaxx/wrap/wire.hpp>


namespace rdmaxx {
namespace detail {
namespace {

// Every message starts with this header (big-endian):
//   kind u8, reserved u8, credits u16 (receive buffers the sender reposted since its
//   last message: credits returned), payload length u32.
enum class Kind : std::uint8_t { user = 1, credit, mr_lend, mr_request, mr_grant, mr_deny, mr_return, mr_return_ack };
constexpr std::size_t header_bytes = 8;
constexpr std::size_t control_max = 64;               // largest control payload
constexpr std::size_t slot_bytes = header_bytes + control_max;
constexpr std::uint32_t user_reserve = 2;             // credits only control messages may use
// wr_id: the top byte says what the WR is, the rest which one
constexpr std::uint64_t tag_send = 1ull << 56, tag_recv = 2ull << 56, tag_op = 3ull << 56;
constexpr std::uint64_t tag_mask = 0xffull << 56;

// Control payloads, built and parsed in one place.
struct Control {
    std::array<std::byte, control_max> bytes{};
    std::size_t size = 0;
    Control& u(std::uint64_t value, int width) {
        wire::put(bytes.data() + size, value, width);
        size += static_cast<std::size_t>(width);
        return *this;
    }
};

struct ControlReader {
    std::span<const std::byte> in;
    std::size_t at = 0;
    bool ok = true;
    std::uint64_t u(int width) {
        if (in.size() - at < static_cast<std::size_t>(width)) {
            ok = false;
            return 0;
        }
        const auto v = wire::get(in.data() + at, width);
        at += static_cast<std::size_t>(width);
        return v;
    }
};

std::uint64_t random_token() {
    static thread_local std::mt19937_64 engine{std::random_device{}()};
    return engine() | 1; // never 0
}

} // namespace

struct Group {
    Context context;
    ProtectionDomain pd;
    CompletionQueue cq;
    std::unordered_map<std::uint32_t, Link*> links; // by QPN

    Result<void> pump();
};

struct Link {
    struct Incoming {
        std::uint32_t buffer;
        std::uint32_t length;
        std::optional<std::uint32_t> imm;
    };
    struct Lease {
        std::uint64_t token;
        MemoryRegion mr;
        Clock::time_point expires;
        bool granted; // allocated on the peer's request: counts against its quota
    };
    struct Outgoing {
        Kind kind;
        Control payload;
    };

    std::shared_ptr<Group> group;
    ConnectionOptions options;
    // the peer's side channel: quiet after the handshake, it reports the peer's death
    std::optional<TcpStream> tcp;
    std::optional<CmConnection> cm;
    QueuePair qp;
    MemoryRegion receive_mr;
    MemoryRegion send_mr;
    std::uint32_t buffer_bytes;       // header + max_message
    std::uint32_t peer_max_message = 0;
    std::uint32_t credits = 0;        // peer receive buffers we may fill
    std::uint32_t unreported = 0;     // our reposted buffers the peer does not know of
    std::vector<bool> slot_busy;
    std::vector<std::optional<Error>> slot_error;
    std::deque<Incoming> inbox;       // at most receive_depth: bounded by our credits
    std::deque<std::uint32_t> write_imms;
    std::deque<Outgoing> outbox;      // control messages waiting for a credit or slot
    std::deque<RemoteMr> lent_to_us;
    std::deque<MemoryRegion> returned;
    std::vector<Lease> leases;
    std::uint64_t granted_bytes = 0;
    std::uint64_t next_request = 1;
    std::map<std::uint64_t, Result<RemoteMr>> grants;    // request id -> answer
    std::map<std::uint64_t, int> return_acks;            // token -> errno (0: taken back)
    std::uint64_t next_op = 1;
    std::optional<WorkCompletion> op_done;
    std::uint64_t op_awaited = 0;
    std::optional<Error> broken;

    Link(std::shared_ptr<Group> g, const ConnectionOptions& o, QueuePair q, MemoryRegion receive, MemoryRegion send,
         std::uint32_t buffer, std::uint32_t slots)
        : group(std::move(g)), options(o), qp(std::move(q)),
          receive_mr(std::move(receive)), send_mr(std::move(send)), buffer_bytes(buffer), slot_busy(slots, false),
          slot_error(slots) {}
    Link(const Link&) = delete;
    Link& operator=(const Link&) = delete;
    ~Link() { group->links.erase(qp.qpn()); }

    Error fail(Error e) {
        if (!broken)
            broken = e;
        return e;
    }

    Result<void> post_receive(std::uint32_t index) {
        return post_recv(qp, receive_mr.slice(std::size_t{index} * buffer_bytes, buffer_bytes), tag_recv | index);
    }

    // --- completions -----------------------------------------------------------
    void on_completion(const WorkCompletion& wc) {
        const std::uint64_t tag = wc.wr_id() & tag_mask;
        const std::uint64_t id = wc.wr_id() & ~tag_mask;
        if (tag == tag_send) {
            slot_busy[id] = false;
            if (!wc.ok())
                slot_error[id] = fail(wc.error());
        } else if (tag == tag_op) {
            if (id == op_awaited)
                op_done = wc;
            if (!wc.ok())
                fail(wc.error());
        } else if (tag == tag_recv) {
            if (!wc.ok()) {
                fail(wc.error());
                return;
            }
            if (auto handled = on_receive(static_cast<std::uint32_t>(id), wc); !handled)
                fail(std::move(handled.error()));
        }
    }

    Result<void> on_receive(std::uint32_t index, const WorkCompletion& wc) {
        if (wc.opcode() == WcOpcode::recv_rdma_with_imm) {
            write_imms.push_back(*wc.imm());
            return recycle(index);
        }
        const std::byte* buffer = receive_mr.data() + std::size_t{index} * buffer_bytes;
        if (wc.byte_len() < header_bytes)
            return std::unexpected(Error::protocol("Connection", fmt::format("a {}-byte message", wc.byte_len())));
        const auto kind = static_cast<Kind>(buffer[0]);
        credits += static_cast<std::uint32_t>(wire::get(buffer + 2, 2));
        const auto length = static_cast<std::uint32_t>(wire::get(buffer + 4, 4));
        if (length != wc.byte_len() - header_bytes)
            return std::unexpected(Error::protocol(
                "Connection", fmt::format("header says {} bytes, {} arrived", length, wc.byte_len() - header_bytes)));
        if (kind == Kind::user) {
            inbox.push_back({index, length, wc.imm()});
            return {};
        }
        if (length > control_max)
            return std::unexpected(Error::protocol("Connection", fmt::format("a {}-byte control message", length)));
        Control copy;
        std::memcpy(copy.bytes.data(), buffer + header_bytes, length);
        copy.size = length;
        if (auto recycled = recycle(index); !recycled)
            return recycled;
        return on_control(kind, copy);
    }

    // Reposts a receive buffer: one more credit to return to the peer.
    Result<void> recycle(std::uint32_t index) {
        if (auto ok = post_receive(index); !ok)
            return ok;
        ++unreported;
        return {};
    }

    Result<void> on_control(Kind kind, const Control& c) {
        ControlReader r{std::span(c.bytes.data(), c.size)};
        switch (kind) {
        case Kind::credit: return {};
        case Kind::mr_lend:
        case Kind::mr_grant: {
            const auto request = r.u(8);
            RemoteMr mr{.memory = {.addr = r.u(8), .length = r.u(8), .rkey = static_cast<std::uint32_t>(r.u(4))},
                        .token = 0};
            mr.token = r.u(8);
            mr.access = static_cast<Access>(r.u(4));
            mr.expires = Clock::now() + std::chrono::milliseconds(r.u(4));
            if (!r.ok)
                break;
            if (kind == Kind::mr_lend)
                lent_to_us.push_back(mr);
            else
                grants.insert_or_assign(request, mr);
            return {};
        }
        case Kind::mr_deny: {
            const auto request = r.u(8);
            const auto code = static_cast<int>(r.u(4));
            if (!r.ok)
                break;
            grants.insert_or_assign(request, std::unexpected(Error::from_errno(
                                                 "request_remote_mr", code, "the owner refused the request")));
            return {};
        }
        case Kind::mr_request: {
            const auto request = r.u(8);
            const auto size = r.u(8);
            const auto access = static_cast<Access>(r.u(4));
            const auto lease = std::min<std::uint64_t>(r.u(4), static_cast<std::uint64_t>(options.max_lease.count()));
            if (!r.ok)
                break;
            return grant(request, size, access, std::chrono::milliseconds(lease));
        }
        case Kind::mr_return: {
            const auto token = r.u(8);
            if (!r.ok)
                break;
            int status = ESTALE; // expired, or never ours
            if (auto it = std::find_if(leases.begin(), leases.end(), [&](const Lease& l) { return l.token == token; });
                it != leases.end()) {
                if (it->granted)
                    granted_bytes -= it->mr.size();
                returned.push_back(std::move(it->mr));
                leases.erase(it);
                status = 0;
            }
            queue(Kind::mr_return_ack, Control{}.u(token, 8).u(static_cast<std::uint32_t>(status), 4));
            return {};
        }
        case Kind::mr_return_ack: {
            const auto token = r.u(8);
            const auto status = static_cast<int>(r.u(4));
            if (!r.ok)
                break;
            return_acks.insert_or_assign(token, status);
            return {};
        }
        case Kind::user: break;
        }
        if (!r.ok)
            return std::unexpected(Error::protocol("Connection", "a truncated control message"));
        return std::unexpected(
            Error::protocol("Connection", fmt::format("unknown message kind {}", static_cast<unsigned>(kind))));
    }

    // The owner's side of request_remote_mr: ceiling, quota, then a fresh region.
    Result<void> grant(std::uint64_t request, std::uint64_t size, Access access, std::chrono::milliseconds lease) {
        int refusal = 0;
        if (!has(options.access_ceiling, access))
            refusal = EACCES;
        else if (size == 0 || size > options.quota_bytes - std::min(options.quota_bytes, granted_bytes))
            refusal = EDQUOT;
        if (refusal == 0) {
            auto mr = MemoryRegion::allocate(group->pd, size, access);
            if (mr) {
                const auto token = random_token();
                const RemoteMemory remote = mr->remote();
                granted_bytes += size;
                leases.push_back({token, std::move(*mr), Clock::now() + lease, true});
                queue(Kind::mr_grant, describe(request, remote, token, access, lease));
                return {};
            }
            logger()->warn("Connection: a requested region of {} bytes: {}", size, mr.error());
            refusal = ENOMEM;
        }
        queue(Kind::mr_deny, Control{}.u(request, 8).u(static_cast<std::uint32_t>(refusal), 4));
        return {};
    }

    static Control describe(std::uint64_t request, const RemoteMemory& remote, std::uint64_t token, Access access,
                            std::chrono::milliseconds lease) {
        return Control{}
            .u(request, 8)
            .u(remote.addr, 8)
            .u(remote.length, 8)
            .u(remote.rkey, 4)
            .u(token, 8)
            .u(static_cast<unsigned>(access), 4)
            .u(static_cast<std::uint64_t>(lease.count()), 4);
    }

    // A lease that ran out is deregistered now: a late access fails at the NIC, and
    // the memory is freed only after the deregistration.
    void expire_leases(Clock::time_point now) {
        std::erase_if(leases, [&](Lease& l) {
            if (now < l.expires)
                return false;
            if (l.granted)
                granted_bytes -= l.mr.size();
            return true;
        });
    }

    // --- sending -------------------------------------------------------------
    void queue(Kind kind, const Control& payload) { outbox.push_back({kind, payload}); }

    std::optional<std::uint32_t> free_slot() const {
        for (std::uint32_t i = 0; i < slot_busy.size(); ++i)
            if (!slot_busy[i])
                return i;
        return std::nullopt;
    }

    // Posts one message from slot `slot`: header (+ control payload) and, for a user
    // message, the caller's bytes as a second SGE.
    Result<void> post_message(std::uint32_t slot, Kind kind, std::span<const std::byte> control_payload,
                              const LocalSlice* user, std::optional<std::uint32_t> imm) {
        std::byte* header = send_mr.data() + std::size_t{slot} * slot_bytes;
        const std::uint32_t returned_credits = std::min<std::uint32_t>(unreported, 0xffff);
        const auto length = user ? user->size() : static_cast<std::uint32_t>(control_payload.size());
        header[0] = static_cast<std::byte>(kind);
        header[1] = std::byte{0};
        wire::put(header + 2, returned_credits, 2);
        wire::put(header + 4, length, 4);
        if (!control_payload.empty()) // memcpy from an empty span's null is UB
            std::memcpy(header + header_bytes, control_payload.data(), control_payload.size());
        const LocalSlice parts[2] = {send_mr.slice(std::size_t{slot} * slot_bytes, header_bytes + control_payload.size()),
                                     user ? *user : LocalSlice(nullptr, 0, 0)};
        const std::span<const LocalSlice> sgl(parts, user ? 2 : 1);
        const PostOptions post{.wr_id = tag_send | slot};
        auto posted = imm ? post_send_with_imm(qp, sgl, *imm, post) : post_send(qp, sgl, post);
        if (!posted)
            return std::unexpected(fail(std::move(posted.error())));
        slot_busy[slot] = true;
        slot_error[slot].reset();
        --credits;
        unreported -= returned_credits;
        return {};
    }

    // Sends queued control messages while credits and slots allow; never waits.
    Result<void> flush() {
        while (!outbox.empty() && credits > 0) {
            const auto slot = free_slot();
            if (!slot)
                break;
            const Outgoing& next = outbox.front();
            if (auto ok = post_message(*slot, next.kind, std::span(next.payload.bytes.data(), next.payload.size),
                                       nullptr, std::nullopt);
                !ok)
                return ok;
            outbox.pop_front();
        }
        // return credits on their own once half the receive queue waits for them
        if (unreported >= std::max(1u, options.receive_depth / 2) && outbox.empty() && credits > 0)
            if (const auto slot = free_slot())
                return post_message(*slot, Kind::credit, {}, nullptr, std::nullopt);
        return {};
    }

    // --- waiting ---------------------------------------------------------------
    const std::string& peer() const { return tcp ? tcp->peer() : cm->peer(); }
    int watch_fd() const { return tcp ? tcp->fd() : cm->fd(); }

    // The side channel: readable means the peer closed it (died), disconnected or
    // broke protocol.
    void check_peer() {
        if (cm) {
            if (auto alive = cm->check_alive(); !alive)
                fail(std::move(alive.error()));
            return;
        }
        pollfd pfd{.fd = tcp->fd(), .events = POLLIN, .revents = 0};
        if (::poll(&pfd, 1, 0) <= 0)
            return;
        std::byte b;
        const ssize_t n = ::recv(tcp->fd(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            fail(Error::from_errno("Connection", ECONNRESET,
                                   fmt::format("peer {} closed its control connection", peer())));
        else if (n > 0)
            fail(Error::protocol("Connection", fmt::format("peer {} wrote to the control connection", peer())));
    }

    template <class Done>
    Result<void> wait(Done&& done, const char* what) {
        const auto deadline = Clock::now() + options.timeout;
        for (;;) {
            if (auto ok = group->pump(); !ok)
                return ok;
            if (done())
                return {};
            check_peer();
            if (broken)
                return std::unexpected(*broken);
            if (auto armed = group->cq.arm(); !armed)
                return armed;
            if (auto ok = group->pump(); !ok)
                return ok;
            if (done())
                return {};
            const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
            if (left.count() <= 0)
                return std::unexpected(Error::timeout(
                    "Connection", fmt::format("{}: nothing from peer {} within {} ms", what, peer(),
                                              options.timeout.count())));
            if (auto woke = group->cq.wait_event(left, watch_fd()); !woke && !woke.error().is_timeout())
                return woke;
        }
    }

    Result<void> send_user(const LocalSlice& message, std::optional<std::uint32_t> imm) {
        if (message.size() > peer_max_message)
            return std::unexpected(Error::from_errno(
                "Connection::send", EMSGSIZE,
                fmt::format("{} bytes: the peer receives at most {} per message", message.size(), peer_max_message)));
        std::optional<std::uint32_t> slot;
        if (auto ok = wait([&] { return credits > user_reserve && (slot = free_slot()); }, "send: waiting for a credit");
            !ok)
            return ok;
        if (auto ok = post_message(*slot, Kind::user, {}, &message, imm); !ok)
            return ok;
        const std::uint32_t s = *slot;
        if (auto ok = wait([&] { return !slot_busy[s]; }, "send: waiting for its completion"); !ok)
            return ok;
        if (slot_error[s])
            return std::unexpected(*slot_error[s]);
        return {};
    }

    // Posts a one-sided operation with `post` and waits for its completion.
    template <class Post>
    Result<void> one_sided(Post&& post) {
        if (broken)
            return std::unexpected(*broken);
        op_awaited = next_op++;
        op_done.reset();
        if (auto ok = post(PostOptions{.wr_id = tag_op | op_awaited}); !ok)
            return ok;
        if (auto ok = wait([&] { return op_done.has_value(); }, "waiting for a one-sided operation"); !ok)
            return ok;
        return op_done->check();
    }
};

Result<void> Group::pump() {
    std::array<WorkCompletion, 16> batch;
    for (;;) {
        auto n = poll(cq, batch);
        if (!n)
            return std::unexpected(std::move(n.error()));
        for (std::size_t i = 0; i < *n; ++i)
            if (auto it = links.find(batch[i].qp_num()); it != links.end()) // else: a closed connection's
                it->second->on_completion(batch[i]);
        if (*n < batch.size())
            break;
    }
    const auto now = Clock::now();
    for (auto& [qpn, link] : links) {
        link->expire_leases(now);
        if (auto ok = link->flush(); !ok)
            link->fail(std::move(ok.error()));
    }
    return {};
}

namespace {

Result<std::shared_ptr<Group>> make_group(const ConnectionOptions& options) {
    auto context = Context::open(options.device);
    if (!context)
        return std::unexpected(std::move(context.error()));
    auto pd = ProtectionDomain::create(*context);
    if (!pd)
        return std::unexpected(std::move(pd.error()));
    const auto depth = std::min<std::uint32_t>(8192, static_cast<std::uint32_t>(context->attributes().raw.max_cqe));
    auto cq = CompletionQueue::create(*context, {.depth = depth, .channel = true});
    if (!cq)
        return std::unexpected(std::move(cq.error()));
    return std::make_shared<Group>(Group{std::move(*context), std::move(*pd), std::move(*cq), {}});
}

// The options, with the device RDMA CM resolved to (when it names one).
template <class Cm>
ConnectionOptions on_device_of(const Cm& cm, ConnectionOptions options) {
    if (!cm.device().empty()) {
        options.device = cm.device();
        options.port = cm.ib_port();
    }
    return options;
}

// A link's verbs objects: QP and buffers; not yet connected.
Result<std::unique_ptr<Link>> create_link(std::shared_ptr<Group> group, const ConnectionOptions& options) {
    auto qp = QueuePair::create(group->pd, {.send_cq = &group->cq,
                                            .recv_cq = &group->cq,
                                            .caps = {.max_send_wr = options.max_send_wr,
                                                     .max_recv_wr = options.receive_depth,
                                                     .max_send_sge = 2,
                                                     .max_recv_sge = 1},
                                            .port = options.port,
                                            .gid_index = options.gid_index});
    if (!qp)
        return std::unexpected(std::move(qp.error()));
    const std::uint32_t buffer_bytes = static_cast<std::uint32_t>(header_bytes) + options.max_message;
    auto receive_mr =
        MemoryRegion::allocate(group->pd, std::size_t{buffer_bytes} * options.receive_depth, Access::local_write);
    if (!receive_mr)
        return std::unexpected(std::move(receive_mr.error()));
    const std::uint32_t slots = std::min<std::uint32_t>(options.max_send_wr, 32);
    auto send_mr = MemoryRegion::allocate(group->pd, slot_bytes * slots, Access::local_write);
    if (!send_mr)
        return std::unexpected(std::move(send_mr.error()));
    return std::make_unique<Link>(std::move(group), options, std::move(*qp), std::move(*receive_mr),
                                  std::move(*send_mr), buffer_bytes, slots);
}

// Our endpoint message: the QP, and what the peer needs besides: our message limit
// and how many receives we post (its credits). 56 bytes: RDMA CM's private data
// limit for a connect request.
EndpointMessage describe_link(const Link& link) {
    EndpointMessage mine{.qps = {{.endpoint = link.qp.endpoint(), .type = link.qp.type()}},
                         .metadata = std::vector<std::byte>(8)};
    wire::put(mine.metadata.data(), link.options.max_message, 4);
    wire::put(mine.metadata.data() + 4, link.options.receive_depth, 4);
    return mine;
}

// Takes the peer's limits and posts our receives: after this the peer may send.
Result<void> start_link(Link& link, const EndpointMessage& peer) {
    if (peer.metadata.size() != 8 || peer.qps.size() != 1)
        return std::unexpected(Error::protocol("Connection", "the peer's connection description is malformed"));
    link.peer_max_message = static_cast<std::uint32_t>(wire::get(peer.metadata.data(), 4));
    link.credits = static_cast<std::uint32_t>(wire::get(peer.metadata.data() + 4, 4));
    if (link.credits <= user_reserve)
        return std::unexpected(Error::protocol(
            "Connection", fmt::format("the peer posts {} receives: at least {} are needed", link.credits,
                                      user_reserve + 1)));
    for (std::uint32_t i = 0; i < link.options.receive_depth; ++i)
        if (auto ok = link.post_receive(i); !ok)
            return ok;
    return {};
}

// TCP: endpoints exchanged over the stream, QP connected, receives posted, and both
// sides' readiness confirmed.
Result<std::unique_ptr<Link>> handshake_tcp(std::shared_ptr<Group> group, TcpStream stream,
                                            const ConnectionOptions& options) {
    auto link = create_link(std::move(group), options);
    if (!link)
        return link;
    Link& l = **link;
    l.tcp.emplace(std::move(stream));
    QueuePair* qps[] = {&l.qp};
    const EndpointMessage mine = describe_link(l);
    auto peer = connect_over_tcp(*l.tcp, qps, mine.metadata, options.connect, options.timeout);
    if (!peer)
        return std::unexpected(std::move(peer.error()));
    if (auto ok = start_link(l, *peer); !ok)
        return std::unexpected(std::move(ok.error()));
    if (auto ok = l.tcp->confirm_ready(options.timeout); !ok)
        return std::unexpected(std::move(ok.error()));
    l.group->links.emplace(l.qp.qpn(), &l);
    return link;
}

// RDMA CM, active side: resolve, connect with our endpoint as private data, take the
// server's from the response, then establish (our receives are posted by then).
Result<std::unique_ptr<Link>> handshake_cm_client(std::string_view host, std::uint16_t port,
                                                  const ConnectionOptions& options) {
    auto cm = CmConnection::resolve(host, port, options.timeout);
    if (!cm)
        return std::unexpected(std::move(cm.error()));
    const ConnectionOptions on_device = on_device_of(*cm, options);
    auto group = make_group(on_device);
    if (!group)
        return std::unexpected(std::move(group.error()));
    auto link = create_link(std::move(*group), on_device);
    if (!link)
        return link;
    Link& l = **link;
    auto peer = cm->connect(l.qp, describe_link(l).metadata, options.connect, options.timeout);
    if (!peer)
        return std::unexpected(std::move(peer.error()));
    if (auto ok = start_link(l, *peer); !ok)
        return std::unexpected(std::move(ok.error()));
    if (auto ok = cm->establish(); !ok)
        return std::unexpected(std::move(ok.error()));
    l.cm.emplace(std::move(*cm));
    l.group->links.emplace(l.qp.qpn(), &l);
    return link;
}

// RDMA CM, passive side: our QP connected and receives posted before we accept.
Result<std::unique_ptr<Link>> handshake_cm_server(std::shared_ptr<Group> group, CmRequest request,
                                                  const ConnectionOptions& options) {
    if (request.device() != group->context.name())
        return std::unexpected(Error::from_errno("rdma_cm", EXDEV,
                                                 fmt::format("{} reached device {}, the listener serves {}",
                                                             request.peer(), request.device(), group->context.name())));
    auto link = create_link(std::move(group), options);
    if (!link)
        return link;
    Link& l = **link;
    if (auto ok = request.connect(l.qp, options.connect); !ok)
        return std::unexpected(std::move(ok.error()));
    if (auto ok = start_link(l, request.offer()); !ok)
        return std::unexpected(std::move(ok.error()));
    auto cm = std::move(request).accept(l.qp, describe_link(l).metadata, options.timeout);
    if (!cm)
        return std::unexpected(std::move(cm.error()));
    l.cm.emplace(std::move(*cm));
    l.group->links.emplace(l.qp.qpn(), &l);
    return link;
}

} // namespace
} // namespace detail

// --- Connection ----------------------------------------------------------------

Connection::Connection(std::unique_ptr<detail::Link> link) : link_(std::move(link)) {}
Connection::Connection(Connection&&) noexcept = default;
Connection& Connection::operator=(Connection&&) noexcept = default;
Connection::~Connection() = default;

Result<Connection> Connection::connect(std::string_view host, std::uint16_t port, const ConnectionOptions& options) {
    if (options.transport == Transport::rdma_cm) {
        auto link = detail::handshake_cm_client(host, port, options);
        if (!link)
            return std::unexpected(std::move(link.error()));
        return Connection(std::move(*link));
    }
    auto group = detail::make_group(options);
    if (!group)
        return std::unexpected(std::move(group.error()));
    auto stream = TcpStream::connect(host, port, options.timeout);
    if (!stream)
        return std::unexpected(std::move(stream.error()));
    auto link = detail::handshake_tcp(std::move(*group), std::move(*stream), options);
    if (!link)
        return std::unexpected(std::move(link.error()));
    return Connection(std::move(*link));
}

const QueuePair& Connection::queue_pair() const { return link_->qp; }
const ConnectionOptions& Connection::options() const { return link_->options; }

Result<void> Connection::progress() {
    if (auto ok = link_->group->pump(); !ok)
        return ok;
    link_->check_peer();
    if (link_->broken)
        return std::unexpected(*link_->broken);
    return {};
}

Result<MemoryRegion> Connection::alloc_local_mr(std::size_t size, Access access) {
    return MemoryRegion::allocate(link_->group->pd, size, access);
}

Result<void> Connection::send_local_mr(MemoryRegion mr, std::chrono::milliseconds lease, std::source_location where) {
    require(mr.get(where)->pd == link_->group->pd.get(where), where,
            "send_local_mr of a region registered in another protection domain");
    detail::Link& l = *link_;
    lease = std::min(lease, l.options.max_lease);
    const auto token = detail::random_token();
    l.queue(detail::Kind::mr_lend, detail::Link::describe(0, mr.remote(), token, mr.access(), lease));
    l.leases.push_back({token, std::move(mr), Clock::now() + lease, false});
    return progress();
}

Result<RemoteMr> Connection::receive_remote_mr() {
    detail::Link& l = *link_;
    if (auto ok = l.wait([&] { return !l.lent_to_us.empty(); }, "receive_remote_mr"); !ok)
        return std::unexpected(std::move(ok.error()));
    RemoteMr mr = l.lent_to_us.front();
    l.lent_to_us.pop_front();
    return mr;
}

Result<RemoteMr> Connection::request_remote_mr(std::size_t size, Access access, std::chrono::milliseconds lease) {
    detail::Link& l = *link_;
    const std::uint64_t request = l.next_request++;
    l.queue(detail::Kind::mr_request, detail::Control{}
                                          .u(request, 8)
                                          .u(size, 8)
                                          .u(static_cast<unsigned>(access), 4)
                                          .u(static_cast<std::uint64_t>(lease.count()), 4));
    if (auto ok = l.wait([&] { return l.grants.contains(request); }, "request_remote_mr"); !ok)
        return std::unexpected(std::move(ok.error()));
    auto node = l.grants.extract(request);
    return std::move(node.mapped());
}

Result<void> Connection::send_remote_mr(const RemoteMr& mr) {
    detail::Link& l = *link_;
    l.return_acks.erase(mr.token);
    l.queue(detail::Kind::mr_return, detail::Control{}.u(mr.token, 8));
    if (auto ok = l.wait([&] { return l.return_acks.contains(mr.token); }, "send_remote_mr"); !ok)
        return ok;
    const int status = l.return_acks.extract(mr.token).mapped();
    if (status != 0)
        return std::unexpected(Error::from_errno("send_remote_mr", status,
                                                 "the owner refused the region: its lease ended or it was never lent"));
    return {};
}

Result<MemoryRegion> Connection::receive_local_mr() {
    detail::Link& l = *link_;
    if (auto ok = l.wait([&] { return !l.returned.empty(); }, "receive_local_mr"); !ok)
        return std::unexpected(std::move(ok.error()));
    MemoryRegion mr = std::move(l.returned.front());
    l.returned.pop_front();
    return mr;
}

Result<void> Connection::read(const LocalSlice& local, const RemoteMemory& remote) {
    return link_->one_sided([&](const PostOptions& o) { return post_read(link_->qp, local, remote, o); });
}

Result<void> Connection::write(const LocalSlice& local, const RemoteMemory& remote) {
    return link_->one_sided([&](const PostOptions& o) { return post_write(link_->qp, local, remote, o); });
}

Result<void> Connection::write_with_imm(const LocalSlice& local, const RemoteMemory& remote, std::uint32_t imm) {
    detail::Link& l = *link_;
    // it fills one of the peer's receives: a credit like a message
    if (auto ok = l.wait([&] { return l.credits > detail::user_reserve; }, "write_with_imm: waiting for a credit");
        !ok)
        return ok;
    --l.credits;
    return l.one_sided([&](const PostOptions& o) { return post_write_with_imm(l.qp, local, remote, imm, o); });
}

Result<void> Connection::compare_swap(const LocalSlice& result, const RemoteMemory& target, std::uint64_t compare,
                                      std::uint64_t swap) {
    return link_->one_sided(
        [&](const PostOptions& o) { return post_compare_swap(link_->qp, result, target, compare, swap, o); });
}

Result<void> Connection::fetch_add(const LocalSlice& result, const RemoteMemory& target, std::uint64_t add) {
    return link_->one_sided([&](const PostOptions& o) { return post_fetch_add(link_->qp, result, target, add, o); });
}

Result<void> Connection::send(const LocalSlice& message) { return link_->send_user(message, std::nullopt); }

Result<void> Connection::send_with_imm(const LocalSlice& message, std::uint32_t imm) {
    return link_->send_user(message, imm);
}

Result<Received> Connection::receive(std::span<std::byte> into) {
    detail::Link& l = *link_;
    if (auto ok = l.wait([&] { return !l.inbox.empty(); }, "receive"); !ok)
        return std::unexpected(std::move(ok.error()));
    const detail::Link::Incoming next = l.inbox.front();
    if (next.length > into.size())
        return std::unexpected(Error::from_errno(
            "Connection::receive", EMSGSIZE,
            fmt::format("a {}-byte message does not fit {} bytes; it stays queued", next.length, into.size())));
    if (next.length != 0) // `into` may be empty, and memcpy from or to null is UB
        std::memcpy(into.data(), l.receive_mr.data() + std::size_t{next.buffer} * l.buffer_bytes + detail::header_bytes,
                    next.length);
    l.inbox.pop_front();
    if (auto ok = l.recycle(next.buffer); !ok)
        return std::unexpected(l.fail(std::move(ok.error())));
    if (auto ok = l.flush(); !ok)
        return std::unexpected(l.fail(std::move(ok.error())));
    return Received{.size = next.length, .imm = next.imm};
}

Result<std::uint32_t> Connection::receive_write_imm() {
    detail::Link& l = *link_;
    if (auto ok = l.wait([&] { return !l.write_imms.empty(); }, "receive_write_imm"); !ok)
        return std::unexpected(std::move(ok.error()));
    const std::uint32_t imm = l.write_imms.front();
    l.write_imms.pop_front();
    return imm;
}

// --- Listener ------------------------------------------------------------------

Listener::Listener(Listener&&) noexcept = default;
Listener& Listener::operator=(Listener&&) noexcept = default;
Listener::~Listener() = default;

Result<Listener> Listener::listen(std::string_view host, std::uint16_t port, const ConnectionOptions& options) {
    Listener listener;
    listener.options_ = options;
    if (options.transport == Transport::rdma_cm) {
        auto cm = CmListener::listen(host, port);
        if (!cm)
            return std::unexpected(std::move(cm.error()));
        listener.options_ = detail::on_device_of(*cm, options);
        listener.cm_.emplace(std::move(*cm));
    } else {
        auto tcp = TcpListener::listen(host, port);
        if (!tcp)
            return std::unexpected(std::move(tcp.error()));
        listener.tcp_.emplace(std::move(*tcp));
    }
    auto group = detail::make_group(listener.options_);
    if (!group)
        return std::unexpected(std::move(group.error()));
    listener.group_ = std::move(*group);
    return listener;
}

std::uint16_t Listener::port() const { return tcp_ ? tcp_->port() : cm_->port(); }

Result<Connection> Listener::accept(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    const int knock_fd = tcp_ ? tcp_->fd() : cm_->fd();
    for (;;) {
        // serve the accepted connections while no client knocks
        if (auto ok = group_->pump(); !ok)
            return std::unexpected(std::move(ok.error()));
        if (auto ok = group_->cq.arm(); !ok)
            return std::unexpected(std::move(ok.error()));
        if (auto ok = group_->pump(); !ok)
            return std::unexpected(std::move(ok.error()));
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
        pollfd fds[2] = {{.fd = knock_fd, .events = POLLIN, .revents = 0},
                         {.fd = group_->cq.channel_fd(), .events = POLLIN, .revents = 0}};
        const int n = ::poll(fds, 2, static_cast<int>(std::max<long long>(left.count(), 0)));
        if (n < 0 && errno != EINTR)
            return std::unexpected(Error::from_last_errno("poll", "listener"));
        if (fds[1].revents != 0)
            (void)group_->cq.wait_event(std::chrono::milliseconds(0)); // take the event; pump next round
        if (fds[0].revents != 0)
            break;
        if (n == 0 && left.count() <= 0)
            return std::unexpected(Error::timeout("Listener::accept", "no client connected in time"));
    }
    auto accepted = tcp_ ? accept_tcp() : accept_cm(timeout);
    if (!accepted)
        logger()->warn("Listener: a client's handshake failed: {}", accepted.error());
    return accepted;
}

Result<Connection> Listener::accept_tcp() {
    auto stream = tcp_->accept(std::chrono::milliseconds(0));
    if (!stream)
        return std::unexpected(std::move(stream.error()));
    auto link = detail::handshake_tcp(group_, std::move(*stream), options_);
    if (!link)
        return std::unexpected(std::move(link.error()));
    return Connection(std::move(*link));
}

Result<Connection> Listener::accept_cm(std::chrono::milliseconds timeout) {
    auto request = cm_->next(timeout);
    if (!request)
        return std::unexpected(std::move(request.error()));
    auto link = detail::handshake_cm_server(group_, std::move(*request), options_);
    if (!link)
        return std::unexpected(std::move(link.error()));
    return Connection(std::move(*link));
}

} // namespace rdmaxx
