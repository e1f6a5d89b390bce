#include "link.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>

#include <poll.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include <rdmaxx/data/post.hpp>
#include <rdmaxx/data/window_bounds.hpp>
#include <rdmaxx/wrap/deadline.hpp>
#include <rdmaxx/wrap/log.hpp>
#include <rdmaxx/wrap/wire.hpp>

namespace rdmaxx::detail {
namespace {

std::uint64_t random_token() {
    static thread_local std::mt19937_64 engine{std::random_device{}()};
    return engine() | 1; // never 0
}

constexpr std::uint32_t max_slots = 32;
// Window binds a link keeps in flight (its QP's send queue has room for them).
constexpr std::uint32_t max_binds = 16;
constexpr std::size_t max_unreceived = Connection::max_unreceived;

// A receive buffer takes a user message of max_message bytes or any control message,
// whichever is longer: a max_message below a control message's size must not make the
// peer's lending or requests overflow our buffers (both links would break).
std::uint32_t receive_buffer_bytes(const ConnectionOptions& options) {
    return static_cast<std::uint32_t>(control::header_bytes +
                                      std::max<std::size_t>(options.max_message, control::max_payload));
}

// What a grant of `size` bytes costs the owner, counted against its quota: the pool's
// block (the power of two that holds it; above the largest class, its pages), and at
// least a page: so the quota also bounds the keys, registrations or windows, that a peer
// asking for a byte at a time makes us hold (quota_bytes / 4096).
std::uint64_t charge_of(std::uint64_t size) {
    constexpr std::uint64_t page = 4096;
    if (size <= MemoryPool::max_block)
        return std::max(std::bit_ceil(size), page);
    if (size > std::numeric_limits<std::uint64_t>::max() - (page - 1)) // the peer's: any value
        return std::numeric_limits<std::uint64_t>::max();
    return (size + page - 1) / page * page;
}

// Whether windows on this device keep a peer inside them: probed once per device and
// port in a process (window_bounds_enforced), since the probe costs two QPs.
bool windows_bounded(const Context& context, const ProtectionDomain& pd, const ConnectionOptions& options) {
    static std::mutex mutex;
    static std::map<std::pair<std::string, std::uint8_t>, bool> known;
    const std::lock_guard lock(mutex);
    const auto key = std::pair(context.name(), options.port);
    if (const auto it = known.find(key); it != known.end())
        return it->second;
    auto bounded = window_bounds_enforced(context, pd, options.port, options.gid_index);
    if (!bounded)
        logger()->warn("Connection: probing memory windows on {}: {} (taken as not bounded)", context.name(),
                       bounded.error());
    return known[key] = bounded.value_or(false);
}

// Logs `what` the first time this process says it of `device` (each context opened
// would repeat it).
template <class... Args>
void say_once(spdlog::level::level_enum level, const std::string& device, fmt::format_string<Args...> what,
              Args&&... args) {
    static std::mutex mutex;
    static std::set<std::string> said;
    std::string line = fmt::format(what, std::forward<Args>(args)...);
    const std::lock_guard lock(mutex);
    if (said.insert(device + '\0' + line).second)
        logger()->log(level, "Connection: {}: {}", device, line);
}

// ConnectionOptions::lending, resolved for this device: memory_window or registration.
Result<Lending> choose_lending(const Context& context, const ProtectionDomain& pd, const ConnectionOptions& options) {
    const bool windows = context.attributes().type2_windows;
    if (options.lending == Lending::memory_window && !windows)
        return std::unexpected(Error::unsupported(
            "Connection", fmt::format("Lending::memory_window: {} has no type 2 memory windows", context.name())));
    const auto& device = context.name();
    if (options.lending == Lending::registration || !windows) {
        say_once(spdlog::level::info, device, "pooled regions are lent through registrations of their own{}",
                 windows ? "" : " (no type 2 memory windows)");
        return Lending::registration;
    }
    const bool bounded = windows_bounded(context, pd, options);
    if (options.lending == Lending::automatic && !bounded) {
        say_once(spdlog::level::info, device,
                 "pooled regions are lent through registrations of their own (its memory windows do not "
                 "refuse an access outside them)");
        return Lending::registration;
    }
    if (!bounded)
        say_once(spdlog::level::warn, device,
                 "Lending::memory_window although its windows do not refuse an access outside them: a peer's "
                 "key reaches the whole arena under its region");
    else
        say_once(spdlog::level::info, device, "pooled regions are lent through memory windows");
    return Lending::memory_window;
}

} // namespace

// --- limits -------------------------------------------------------------------------

std::array<std::byte, limits_bytes> encode_limits(const Limits& limits) noexcept {
    std::array<std::byte, limits_bytes> bytes{};
    wire::put(bytes.data(), limits.max_message, 4);
    wire::put(bytes.data() + 4, limits.receive_depth, 4);
    return bytes;
}

Result<Limits> decode_limits(std::span<const std::byte> metadata) {
    if (metadata.size() != limits_bytes)
        return std::unexpected(
            Error::protocol("Connection", fmt::format("{} bytes of connection limits, not {}", metadata.size(), limits_bytes)));
    const Limits limits{.max_message = static_cast<std::uint32_t>(wire::get(metadata.data(), 4)),
                        .receive_depth = static_cast<std::uint32_t>(wire::get(metadata.data() + 4, 4))};
    if (limits.max_message == 0 || limits.max_message > max_message_limit)
        return std::unexpected(Error::protocol(
            "Connection", fmt::format("the peer's max_message {} is outside 1..{}", limits.max_message, max_message_limit)));
    if (limits.receive_depth < CreditWindow::min_depth || limits.receive_depth > CreditWindow::max_depth)
        return std::unexpected(Error::protocol(
            "Connection", fmt::format("the peer's receive depth {} is outside {}..{}", limits.receive_depth,
                                      CreditWindow::min_depth, CreditWindow::max_depth)));
    return limits;
}

// --- Group ----------------------------------------------------------------------------

Result<std::shared_ptr<Group>> Group::create(const ConnectionOptions& options) {
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
    auto pool = MemoryPool::create(*pd, options.pool);
    if (!pool)
        return std::unexpected(std::move(pool.error()));
    auto lending = choose_lending(*context, *pd, options);
    if (!lending)
        return std::unexpected(std::move(lending.error()));
    return std::make_shared<Group>(
        Group{std::move(*context), std::move(*pd), std::move(*cq), std::move(*pool), *lending, {}});
}

Result<void> Group::pump() {
    std::array<WorkCompletion, 16> batch;
    for (;;) {
        auto n = poll(cq, batch);
        if (!n)
            return std::unexpected(std::move(n.error()));
        for (std::size_t i = 0; i < *n; ++i)
            if (auto it = links.find(batch[i].qp_num()); it != links.end()) // else: a closed link's flush
                it->second->on_completion(batch[i]);
        if (*n < batch.size())
            break;
    }
    // empty now: a destroyed QP's last completions were taken with the rest
    cq_held -= cq_retired;
    cq_retired = 0;
    const auto now = Clock::now();
    for (auto& [qpn, link] : links) {
        link->expire_leases(now);
        if (auto ok = link->flush(); !ok)
            link->fail(std::move(ok.error()));
    }
    return {};
}

Result<CqEntries> CqEntries::hold(Group& group, std::uint32_t count) {
    // QPs gone may have left completions in the CQ: taking them frees their entries
    if (group.cq_held + count > group.cq.depth() && group.cq_retired != 0)
        if (auto ok = group.pump(); !ok)
            return std::unexpected(std::move(ok.error()));
    const std::uint32_t wanted = group.cq_held + count;
    if (wanted > group.cq.depth()) {
        const auto max_cqe = static_cast<std::uint32_t>(group.context.attributes().raw.max_cqe);
        if (wanted > max_cqe)
            return std::unexpected(Error::from_errno(
                "Connection", ENOBUFS,
                fmt::format("the completion queue shared on {} has {} of the device's max_cqe {} entries held by "
                            "other connections: no room for this one's {}",
                            group.context.name(), group.cq_held, max_cqe, count)));
        const std::uint32_t doubled = group.cq.depth() > max_cqe / 2 ? max_cqe : group.cq.depth() * 2;
        if (auto grown = group.cq.resize(std::max(wanted, doubled)); !grown)
            return std::unexpected(std::move(grown.error()));
    }
    group.cq_held = wanted;
    return CqEntries(group, count);
}

// --- Link: setup ------------------------------------------------------------------------

std::optional<std::uint32_t> Link::SendSlots::free() const {
    for (std::uint32_t i = 0; i < busy.size(); ++i)
        if (!busy[i])
            return i;
    return std::nullopt;
}

bool Link::SendSlots::idle() const { return std::none_of(busy.begin(), busy.end(), [](bool b) { return b; }); }

Link::Link(std::shared_ptr<Group> group, const ConnectionOptions& options, CqEntries cq_entries, MemoryRegion receive,
           SendSlots slots, QueuePair qp)
    : group_(std::move(group)), options_(options), cq_entries_(std::move(cq_entries)), receive_mr_(std::move(receive)),
      slots_(std::move(slots)),
      qp_(std::move(qp)), buffer_bytes_(receive_buffer_bytes(options)),
      leases_(options.quota_bytes), ops_(options.max_send_wr) {
    for (std::uint32_t op = options.max_send_wr; op-- > 0;)
        free_ops_.push_back(op);
}

Result<std::unique_ptr<Link>> Link::create(std::shared_ptr<Group> group, const ConnectionOptions& options) {
    const std::uint32_t slots = std::min(options.max_send_wr, max_slots);
    // each send slot, max_send_wr one-sided operations, and the window binds in flight
    const std::uint32_t send_wr =
        slots + options.max_send_wr + (group->lending == Lending::memory_window ? max_binds : 0);
    auto cq_entries = CqEntries::hold(*group, send_wr + options.receive_depth);
    if (!cq_entries)
        return std::unexpected(std::move(cq_entries.error()));
    auto qp = QueuePair::create(group->pd, {.send_cq = &group->cq,
                                            .recv_cq = &group->cq,
                                            .caps = {.max_send_wr = send_wr,
                                                     .max_recv_wr = options.receive_depth,
                                                     .max_send_sge = 2,
                                                     .max_recv_sge = 1},
                                            .port = options.port,
                                            .gid_index = options.gid_index});
    if (!qp)
        return std::unexpected(std::move(qp.error()));
    const std::size_t buffer_bytes = receive_buffer_bytes(options);
    auto receive = MemoryRegion::allocate(group->pd, buffer_bytes * options.receive_depth, Access::local_write);
    if (!receive)
        return std::unexpected(std::move(receive.error()));
    auto send = MemoryRegion::allocate(group->pd, control::max_message_bytes * slots, Access::local_write);
    if (!send)
        return std::unexpected(std::move(send.error()));
    SendSlots send_slots{std::move(*send), std::vector<bool>(slots, false), std::vector<std::optional<Error>>(slots)};
    return std::unique_ptr<Link>(
        new Link(std::move(group), options, std::move(*cq_entries), std::move(*receive), std::move(send_slots),
                 std::move(*qp)));
}

Link::~Link() {
    if (!closed_)
        if (auto ok = close(deadline(std::nullopt)); !ok && !broken_)
            logger()->warn("Connection: closing the connection to {}: {}", peer(), ok.error());
    if (registered_)
        group_->links.erase(qp_.qpn());
}

EndpointMessage Link::describe() const {
    const auto limits = encode_limits({.max_message = options_.max_message, .receive_depth = options_.receive_depth});
    return {.qps = {{.endpoint = qp_.endpoint(), .type = qp_.type()}},
            .metadata = std::vector<std::byte>(limits.begin(), limits.end())};
}

Result<void> Link::start(const EndpointMessage& peer) {
    if (peer.qps.size() != 1)
        return std::unexpected(Error::protocol("Connection", fmt::format("the peer offers {} QPs, not 1", peer.qps.size())));
    auto limits = decode_limits(peer.metadata);
    if (!limits)
        return std::unexpected(std::move(limits.error()));
    peer_max_message_ = limits->max_message;
    credits_.emplace(limits->receive_depth, options_.receive_depth);
    for (std::uint32_t i = 0; i < options_.receive_depth; ++i)
        if (auto ok = post_receive(i); !ok)
            return ok;
    group_->links.emplace(qp_.qpn(), this);
    registered_ = true;
    return {};
}

void Link::watch(TcpStream stream) { tcp_.emplace(std::move(stream)); }
void Link::watch(CmConnection cm) { cm_.emplace(std::move(cm)); }

Clock::time_point Link::deadline(std::optional<std::chrono::milliseconds> timeout, std::uint64_t bytes) const {
    if (timeout)
        return deadline_after(*timeout);
    // saturating: a timeout or an allowance of milliseconds::max() ("no limit") must
    // not overflow the clock into a deadline already past
    const double allowance_ms = double(options_.timeout_per_mib.count()) * double(bytes) / double(1 << 20);
    const auto allowance = allowance_ms >= double(std::chrono::milliseconds::max().count())
                               ? std::chrono::milliseconds::max()
                               : std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(allowance_ms)));
    return deadline_after(deadline_after(options_.timeout), allowance);
}

// --- Link: completions and what the peer sends --------------------------------------------

// The first failure ends the connection, and with it every lease: each lent or granted
// region's key dies now, not at its lease's end, which a connection nobody pumps any
// more would never reach (the peer could go on using the key on its QP, or on another
// connection's in this PD).
Error Link::fail(Error e) {
    if (!broken_) {
        broken_ = e;
        leases_.expire(Clock::time_point::max());
    }
    return e;
}

void Link::on_completion(const WorkCompletion& wc) {
    const std::uint64_t tag = wc.wr_id() & tag_mask;
    const std::uint64_t id = wc.wr_id() & ~tag_mask;
    if (tag == tag_send) {
        slots_.busy[id] = false;
        if (!wc.ok())
            slots_.error[id] = fail(wc.error());
    } else if (tag == tag_op) {
        ops_[id] = wc;
        if (!wc.ok())
            fail(wc.error());
    } else if (tag == tag_bind) {
        if (!wc.ok())
            fail(wc.error()); // its loan never starts: destroyed with the link
        else
            on_bound();
    } else if (tag == tag_recv) {
        if (!wc.ok()) {
            fail(wc.error());
            return;
        }
        if (auto handled = on_receive(static_cast<std::uint32_t>(id), wc); !handled)
            fail(std::move(handled.error()));
    }
}

Result<void> Link::on_receive(std::uint32_t buffer, const WorkCompletion& wc) {
    if (auto ok = credits_->received(); !ok)
        return ok;
    if (wc.opcode() == WcOpcode::recv_rdma_with_imm) {
        if (write_imms_.size() == max_unreceived)
            return std::unexpected(Error::protocol(
                "Connection", fmt::format("the peer sent more than {} immediates not yet received", max_unreceived)));
        write_imms_.push_back(*wc.imm());
        return recycle(buffer);
    }
    const std::byte* bytes = receive_mr_.data() + std::size_t{buffer} * buffer_bytes_;
    auto header = control::decode_header(std::span(bytes, std::min<std::size_t>(wc.byte_len(), control::header_bytes)),
                                         wc.byte_len());
    if (!header)
        return std::unexpected(std::move(header.error()));
    if (auto ok = credits_->returned(header->credits); !ok)
        return ok;
    if (header->kind == control::Kind::user) {
        if (header->length > options_.max_message) // it fits the buffer, which takes control messages too
            return std::unexpected(Error::protocol(
                "Connection", fmt::format("the peer sent a message of {} bytes, above the max_message {} it was told",
                                          header->length, options_.max_message)));
        inbox_.push_back({buffer, header->length, wc.imm()});
        return {};
    }
    auto message = control::decode(*header, std::span(bytes + control::header_bytes, header->length));
    if (!message)
        return std::unexpected(std::move(message.error()));
    if (auto recycled = recycle(buffer); !recycled)
        return recycled;
    return on_control(*message);
}

Result<void> Link::on_control(const control::Message& message) {
    const auto remote_mr = [](const control::Region& r) {
        return RemoteMr{.memory = r.memory, .token = r.token, .access = r.access, .expires = Clock::now() + r.lease};
    };
    // an answer to a request we made and that is not answered yet
    const auto answer = [this](std::uint64_t request, Result<RemoteMr> region) -> Result<void> {
        const auto it = grants_.find(request);
        if (it == grants_.end() || it->second.has_value())
            return std::unexpected(Error::protocol(
                "Connection", fmt::format("the peer answered region request {}, which is not waiting", request)));
        it->second = std::move(region);
        return {};
    };
    if (std::holds_alternative<control::Lend>(message)) {
        if (lent_to_us_.size() == max_unreceived)
            return std::unexpected(Error::protocol(
                "Connection", fmt::format("the peer lent more than {} regions not yet received", max_unreceived)));
        lent_to_us_.push_back(remote_mr(std::get<control::Lend>(message).region));
    } else if (const auto* granted = std::get_if<control::Grant>(&message)) {
        return answer(granted->region.request, remote_mr(granted->region));
    } else if (const auto* deny = std::get_if<control::Deny>(&message)) {
        return answer(deny->request, std::unexpected(Error::from_errno("request_remote_mr", deny->code,
                                                                       "the owner refused the request")));
    } else if (const auto* request = std::get_if<control::Request>(&message)) {
        return grant(*request);
    } else if (const auto* given = std::get_if<control::Return>(&message)) {
        queue(control::ReturnAck{.token = given->token, .code = leases_.give_back(given->token) ? 0 : ESTALE});
    } else if (const auto* ack = std::get_if<control::ReturnAck>(&message)) {
        const auto it = return_acks_.find(ack->token);
        if (it == return_acks_.end() || it->second.asked == 0)
            return std::unexpected(Error::protocol(
                "Connection",
                fmt::format("the peer acknowledged a return of token {}, which is not waiting", ack->token)));
        --it->second.asked;
        it->second.codes.push_back(ack->code);
    } else if (std::holds_alternative<control::Goodbye>(message)) {
        peer_said_goodbye_ = true;
        fail(Error::from_errno("Connection", ECONNRESET, fmt::format("peer {} closed the connection", peer())));
    }
    return {}; // Credit: its header said it all
}

// The owner's side of request_remote_mr: ceiling, quota, then a region from the pool.
Result<void> Link::grant(const control::Request& request) {
    const std::uint64_t charge = charge_of(request.size);
    int refusal = 0;
    if (!has(options_.access_ceiling, request.access))
        refusal = EACCES;
    else if (request.size == 0 || (request.access & access_remote) == Access::none)
        refusal = EINVAL;
    else if (charge > std::numeric_limits<std::uint64_t>::max() - binding_bytes_ || // the peer's: any value
             !leases_.fits(charge + binding_bytes_))
        refusal = EDQUOT;
    else if (group_->lending == Lending::memory_window && binding_.size() == max_binds)
        refusal = EBUSY;
    if (refusal == 0) {
        if (auto block = group_->pool.allocate(request.size, request.access); block) {
            const auto lease = std::min(request.lease, options_.max_lease);
            const std::uint64_t token = random_token();
            const control::Region region{
                .request = request.request, .memory = {}, .token = token, .access = request.access, .lease = lease};
            auto exposed = expose(std::move(*block), request.access, token, lease, control::Grant{region}, charge);
            if (exposed || broken_)
                return exposed;
            grant_warnings_.warn(Clock::now(), "Connection: a requested region of {} bytes: {}", request.size,
                                 exposed.error());
        } else {
            grant_warnings_.warn(Clock::now(), "Connection: a requested region of {} bytes: {}", request.size,
                                 block.error());
        }
        refusal = ENOMEM;
    }
    queue(control::Deny{.request = request.request, .code = refusal});
    return {};
}

Result<void> Link::expose(MemoryRegion region, Access rights, std::uint64_t token, std::chrono::milliseconds lease,
                          control::Message announce, std::uint64_t charge) {
    // A region of its own registration is lent through a second one too: its own key,
    // still valid when the region is handed back (receive_local_mr), is never told.
    if (!region.pooled() || group_->lending == Lending::registration) {
        auto registration = MemoryRegion::register_memory(group_->pd, region.bytes(), rights);
        if (!registration) // out of pinnable memory, say: this loan's failure, not the connection's
            return std::unexpected(std::move(registration.error()));
        const RemoteMemory key = registration->remote();
        start_loan(Loan(std::move(region), std::move(*registration)), key, token, lease, std::move(announce), charge);
        return {};
    }
    auto window = MemoryWindow::allocate(group_->pd);
    if (!window)
        return std::unexpected(std::move(window.error()));
    auto key = post_bind(qp_, *window, region, rights & access_remote, {.wr_id = tag_bind});
    if (!key)
        return std::unexpected(fail(std::move(key.error())));
    binding_bytes_ += charge;
    binding_.push_back({Loan(std::move(region), std::move(*window)), *key, token, lease, std::move(announce), charge});
    return {};
}

// The oldest bind completed (binds complete in posting order): its key works now.
void Link::on_bound() {
    Binding bound = std::move(binding_.front());
    binding_.pop_front();
    binding_bytes_ -= bound.charge;
    start_loan(std::move(bound.loan), bound.key, bound.token, bound.lease, std::move(bound.announce), bound.charge);
}

void check_lend(const MemoryRegion& mr, const ProtectionDomain& pd, std::chrono::milliseconds lease,
                std::source_location where) {
    require(mr.get(where)->pd == pd.get(where), where, "send_local_mr of a region registered in another protection domain");
    require((mr.access() & access_remote) != Access::none, where, "send_local_mr of a region with no remote rights ({})",
            mr.access());
    require(lease.count() >= 0, where, "send_local_mr with a negative lease ({} ms)", lease.count());
}

// The lease runs from now; the peer learns the key by `announce`. On a connection that
// ended meanwhile (a window's bind completing after it) the loan ends at once.
void Link::start_loan(Loan loan, const RemoteMemory& key, std::uint64_t token, std::chrono::milliseconds lease,
                      control::Message announce, std::uint64_t charge) {
    if (broken_)
        return;
    std::visit(
        [&](auto& message) {
            if constexpr (requires { message.region; })
                message.region.memory = key;
        },
        announce);
    leases_.add(token, std::move(loan), Clock::now() + lease, charge);
    queue(std::move(announce));
}

Result<void> Link::post_receive(std::uint32_t buffer) {
    return post_recv(qp_, receive_mr_.slice(std::size_t{buffer} * buffer_bytes_, buffer_bytes_), tag_recv | buffer);
}

// Reposts a receive buffer: one more credit to return to the peer.
Result<void> Link::recycle(std::uint32_t buffer) {
    if (auto ok = post_receive(buffer); !ok)
        return ok;
    credits_->reposted();
    return {};
}

// A lease that ran out loses its key now (window deallocated, or registration
// deregistered): a late access fails at the NIC, and the memory goes back to its pool
// or is freed only after that.
void Link::expire_leases(Clock::time_point now) { leases_.expire(now); }

// --- Link: sending ----------------------------------------------------------------------

// Posts one message from `slot`: header (+ control payload) and, for a user message,
// the caller's bytes as a second SGE.
Result<void> Link::post_message(std::uint32_t slot, std::span<const std::byte> header_and_control,
                                const LocalSlice* user, std::optional<std::uint32_t> imm) {
    const std::size_t at = std::size_t{slot} * control::max_message_bytes;
    std::memcpy(slots_.mr.data() + at, header_and_control.data(), header_and_control.size());
    const LocalSlice parts[2] = {slots_.mr.slice(at, header_and_control.size()),
                                 user ? *user : LocalSlice(nullptr, 0, 0)};
    const std::span<const LocalSlice> sgl(parts, user ? 2 : 1);
    const PostOptions post{.wr_id = tag_send | slot};
    auto posted = imm ? post_send_with_imm(qp_, sgl, *imm, post) : post_send(qp_, sgl, post);
    if (!posted)
        return std::unexpected(fail(std::move(posted.error())));
    slots_.busy[slot] = true;
    slots_.error[slot].reset();
    return {};
}

// Sends queued control messages while credits and slots allow, and credits on their
// own when enough wait; never waits.
Result<void> Link::flush() {
    if (!credits_ || broken_)
        return {};
    while (!outbox_.empty() && credits_->can_send(CreditWindow::Use::control)) {
        const auto slot = slots_.free();
        if (!slot)
            return {};
        const std::uint16_t report = credits_->spend();
        const control::Encoded message = control::encode(outbox_.front(), report);
        if (auto ok = post_message(*slot, message.span(), nullptr, std::nullopt); !ok) {
            credits_->unspend(report);
            return ok;
        }
        outbox_.pop_front();
    }
    if (outbox_.empty() && credits_->wants_credit_message())
        if (const auto slot = slots_.free()) {
            const std::uint16_t report = credits_->spend();
            const control::Encoded message = control::encode(control::Credit{}, report);
            if (auto ok = post_message(*slot, message.span(), nullptr, std::nullopt); !ok) {
                credits_->unspend(report);
                return ok;
            }
        }
    return {};
}

Result<void> Link::check_sendable(const LocalSlice& message) const {
    if (broken_)
        return std::unexpected(*broken_);
    if (message.size() > peer_max_message_)
        return std::unexpected(Error::from_errno(
            "Connection::send", EMSGSIZE,
            fmt::format("{} bytes: the peer receives at most {} per message", message.size(), peer_max_message_)));
    return {};
}

bool Link::can_send() const { return credits_->can_send(CreditWindow::Use::user) && slots_.free().has_value(); }

Result<std::uint32_t> Link::post_user_message(const LocalSlice& message, std::optional<std::uint32_t> imm) {
    if (broken_)
        return std::unexpected(*broken_);
    const std::uint32_t slot = *slots_.free();
    const std::uint16_t report = credits_->spend();
    const auto header = control::encode_user_header(static_cast<std::uint32_t>(message.size()), report);
    if (auto ok = post_message(slot, header, &message, imm); !ok) {
        credits_->unspend(report);
        return std::unexpected(std::move(ok.error()));
    }
    return slot;
}

Result<void> Link::send_result(std::uint32_t slot) const {
    if (slots_.error[slot])
        return std::unexpected(*slots_.error[slot]);
    return {};
}

Result<void> Link::send(const LocalSlice& message, std::optional<std::uint32_t> imm, Clock::time_point deadline) {
    if (auto ok = check_sendable(message); !ok)
        return ok;
    if (auto ok = wait([&] { return can_send(); }, "send: waiting for a credit", deadline); !ok)
        return ok;
    auto slot = post_user_message(message, imm);
    if (!slot)
        return std::unexpected(std::move(slot.error()));
    auto delivered = [&] { return sent(*slot); };
    if (auto ok = wait(delivered, "send: waiting for its completion", deadline); !ok) {
        if (!delivered())
            abandon_and_drain(ok.error(), delivered); // the NIC may still read the caller's bytes
        return ok;
    }
    return send_result(*slot);
}

Result<Received> Link::take_message(std::span<std::byte> into) {
    const Incoming next = inbox_.front();
    if (next.length > into.size())
        return std::unexpected(Error::from_errno(
            "Connection::receive", EMSGSIZE,
            fmt::format("a {}-byte message does not fit {} bytes; it stays queued", next.length, into.size())));
    if (next.length != 0) // `into` may be empty, and memcpy from or to null is UB
        std::memcpy(into.data(), receive_mr_.data() + std::size_t{next.buffer} * buffer_bytes_ + control::header_bytes,
                    next.length);
    inbox_.pop_front();
    if (!broken_) {
        if (auto ok = recycle(next.buffer); !ok)
            return std::unexpected(fail(std::move(ok.error())));
        if (auto ok = flush(); !ok)
            return std::unexpected(fail(std::move(ok.error())));
    }
    return Received{.size = next.length, .imm = next.imm};
}

Result<Received> Link::receive(std::span<std::byte> into, Clock::time_point deadline) {
    if (auto ok = wait([&] { return has_message(); }, "receive", deadline); !ok)
        return std::unexpected(std::move(ok.error()));
    return take_message(into);
}

std::uint32_t Link::take_write_imm() {
    const std::uint32_t imm = write_imms_.front();
    write_imms_.pop_front();
    return imm;
}

Result<std::uint32_t> Link::receive_write_imm(Clock::time_point deadline) {
    if (auto ok = wait([&] { return has_write_imm(); }, "receive_write_imm", deadline); !ok)
        return std::unexpected(std::move(ok.error()));
    return take_write_imm();
}

Result<void> Link::take_op(std::uint32_t op) {
    const WorkCompletion wc = *ops_[op];
    ops_[op].reset();
    free_ops_.push_back(op);
    return wc.check();
}

bool Link::can_take_user_credit() const { return credits_->can_send(CreditWindow::Use::user); }
void Link::take_user_credit() { credits_->spend_without_report(); } // a WRITE_WITH_IMM carries no header
void Link::give_back_user_credit() { credits_->unspend(0); }

Result<void> Link::wait_user_credit(Clock::time_point deadline) {
    if (broken_)
        return std::unexpected(*broken_);
    if (auto ok = wait([&] { return can_take_user_credit(); }, "write_with_imm: waiting for a credit", deadline); !ok)
        return ok;
    take_user_credit();
    return {};
}

void Link::abandon(const Error& why) {
    fail(why);
    if (auto ok = qp_.to_error(); !ok)
        logger()->error("Connection: {} (the QP could not be moved to the error state)", ok.error());
}

// --- Link: memory lent, requested, returned --------------------------------------------

bool Link::can_lend(const MemoryRegion& mr) const {
    return !mr.pooled() || group_->lending != Lending::memory_window || binding_.size() < max_binds;
}

Result<void> Link::lend(MemoryRegion mr, std::chrono::milliseconds lease) {
    if (broken_)
        return std::unexpected(*broken_);
    lease = std::min(lease, options_.max_lease);
    const Access access = mr.access() & control::known_access;
    const std::uint64_t token = random_token();
    const control::Region region{.request = 0, .memory = {}, .token = token, .access = access, .lease = lease};
    return expose(std::move(mr), access, token, lease, control::Lend{region}, 0);
}

Result<void> Link::send_local_mr(MemoryRegion mr, std::chrono::milliseconds lease) {
    if (broken_)
        return std::unexpected(*broken_);
    if (auto ok = wait([&] { return can_lend(mr); }, "send_local_mr: a window bind", deadline(std::nullopt)); !ok)
        return ok;
    if (auto ok = lend(std::move(mr), lease); !ok)
        return ok;
    return progress();
}

RemoteMr Link::take_lent_to_us() {
    RemoteMr mr = lent_to_us_.front();
    lent_to_us_.pop_front();
    return mr;
}

Result<RemoteMr> Link::receive_remote_mr(Clock::time_point deadline) {
    if (auto ok = wait([&] { return has_lent_to_us(); }, "receive_remote_mr", deadline); !ok)
        return std::unexpected(std::move(ok.error()));
    return take_lent_to_us();
}

std::uint64_t Link::ask_for_region(std::size_t size, Access access, std::chrono::milliseconds lease,
                                   std::source_location where) {
    require(control::known_rights(access), where,
            "request_remote_mr: rights {:#x} that cannot be lent (only local and remote read, write and atomic)",
            static_cast<unsigned>(access));
    require(lease.count() >= 0 && lease.count() <= control::max_lease_ms, where,
            "request_remote_mr: a lease of {} ms outside 0..{}", lease.count(), control::max_lease_ms);
    const std::uint64_t request = next_request_++;
    queue(control::Request{.request = request, .size = size, .access = access, .lease = lease});
    grants_.emplace(request, std::nullopt); // a request whose wait ends early keeps it: its answer may come
    return request;
}

Result<RemoteMr> Link::take_answer(std::uint64_t request) { return std::move(*grants_.extract(request).mapped()); }

Result<RemoteMr> Link::request_remote_mr(std::size_t size, Access access, std::chrono::milliseconds lease,
                                         Clock::time_point deadline, std::source_location where) {
    if (broken_)
        return std::unexpected(*broken_);
    const std::uint64_t request = ask_for_region(size, access, lease, where);
    if (auto ok = wait([&] { return answered(request); }, "request_remote_mr", deadline); !ok)
        return std::unexpected(std::move(ok.error()));
    return take_answer(request);
}

void Link::give_back(std::uint64_t token) {
    ++return_acks_[token].asked; // each Return gets its ack, taken in order
    queue(control::Return{.token = token});
}

Result<void> Link::take_return_answer(std::uint64_t token) {
    const auto it = return_acks_.find(token);
    const int status = it->second.codes.front();
    it->second.codes.pop_front();
    if (it->second.asked == 0 && it->second.codes.empty())
        return_acks_.erase(it);
    if (status != 0)
        return std::unexpected(Error::from_errno("send_remote_mr", status,
                                                 "the owner refused the region: its lease ended or it was never lent"));
    return {};
}

Result<void> Link::send_remote_mr(const RemoteMr& mr, Clock::time_point deadline) {
    if (broken_)
        return std::unexpected(*broken_);
    give_back(mr.token);
    if (auto ok = wait([&] { return return_answered(mr.token); }, "send_remote_mr", deadline); !ok)
        return ok;
    return take_return_answer(mr.token);
}

MemoryRegion Link::take_returned() { return std::move(*leases_.take_returned()).take(); }

Result<MemoryRegion> Link::receive_local_mr(Clock::time_point deadline) {
    if (auto ok = wait([&] { return has_returned(); }, "receive_local_mr", deadline); !ok)
        return std::unexpected(std::move(ok.error()));
    return take_returned();
}

Result<void> Link::progress() {
    if (auto ok = group_->pump(); !ok)
        return ok;
    check_peer_alive();
    if (broken_)
        return std::unexpected(*broken_);
    return {};
}

bool Link::begin_close() {
    closed_ = true;
    if (broken_ || !(tcp_ || cm_)) // not connected or handed out: no one listens
        return false;
    queue(control::Goodbye{});
    return true;
}

void Link::end_close() {
    if (tcp_)
        ::shutdown(tcp_->fd(), SHUT_WR); // the peer's side channel reads its end
    cm_.reset();                         // disconnects
    fail(Error::from_errno("Connection", ENOTCONN, "the connection was closed"));
}

Result<void> Link::close(Clock::time_point deadline) {
    if (closed_)
        return {};
    Result<void> done{};
    if (begin_close())
        done = wait([&] { return goodbye_done(); }, "close: sending what is queued", deadline);
    end_close();
    return done;
}

// --- Link: the peer's liveness ----------------------------------------------------------

const std::string& Link::peer() const {
    static const std::string unknown = "(not connected)";
    return tcp_ ? tcp_->peer() : cm_ ? cm_->peer() : unknown;
}

int Link::watch_fd() const { return tcp_ ? tcp_->fd() : cm_ ? cm_->fd() : -1; }

// The side channel: readable means the peer closed it (died), disconnected or broke
// protocol.
void Link::check_peer_alive() {
    if (cm_) {
        if (auto alive = cm_->check_alive(); !alive)
            fail(std::move(alive.error()));
        return;
    }
    if (!tcp_)
        return;
    pollfd pfd{.fd = tcp_->fd(), .events = POLLIN, .revents = 0};
    if (::poll(&pfd, 1, 0) <= 0)
        return;
    std::byte b;
    const ssize_t n = ::recv(tcp_->fd(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
    const int error = errno;
    if (n == 0 || (n < 0 && error != EAGAIN && error != EINTR))
        fail(Error::from_errno("Connection", ECONNRESET, fmt::format("peer {} closed its control connection", peer())));
    else if (n > 0)
        fail(Error::protocol("Connection", fmt::format("peer {} wrote to the control connection", peer())));
}

} // namespace rdmaxx::detail
