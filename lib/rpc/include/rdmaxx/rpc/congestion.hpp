/// @file
/// Congestion control for lib/rpc sessions: pluggable, off by default.
///
/// @code
/// rdmaxx::rpc::EndpointOptions options;
/// options.congestion = [] { return std::make_unique<rdmaxx::rpc::Aimd>(rdmaxx::rpc::AimdOptions{.high_rtt = 200us}); };
/// @endcode
///
/// With a factory in EndpointOptions::congestion, each session this endpoint calls
/// through gets its own controller. The controller sets the session's window: how many
/// packets it may have in flight, within its credits (credits protect the server's
/// receive ring, the window the network between them), and learns from every answer
/// and every retransmission timeout. Without one (the default) the credits alone
/// limit a session, and nothing is called per packet.
///
/// Decided: a window, not a rate. The endpoint sends when an answer frees room in the
/// window and never waits on a pacing timer: on a loaded host, and even more on an
/// emulated NIC, a timer's granularity is coarser than the gaps pacing would make. A
/// rate-based law (eRPC's Timely) fits the interface as rate x smoothed RTT.
///
/// @threadsafety A controller is called on its endpoint's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <source_location>

namespace rdmaxx::rpc {

/// A session's congestion controller, the interface: the endpoint asks it for the
/// window and tells it of every answer and every retransmission timeout.
/// @threadsafety Called on its endpoint's thread only.
class CongestionControl {
public:
    /// Destroyed with its session.
    virtual ~CongestionControl() = default;
    /// How many packets the session may have in flight now (the endpoint uses at least
    /// 1 and at most the session's credits).
    virtual std::uint32_t window() const noexcept = 0;
    /// A packet was answered, in order. `round_trip`: the time since its call last sent,
    /// when that is a sample (Karn's rule: none when the call resent a packet, nor for
    /// an answer that leaves packets of its call unanswered).
    virtual void answered(std::optional<std::chrono::nanoseconds> round_trip) noexcept = 0;
    /// A call's retransmission timeout expired: its packets in flight count as lost.
    virtual void timed_out() noexcept = 0;
};

/// Makes a session's controller (EndpointOptions::congestion).
using CongestionFactory = std::function<std::unique_ptr<CongestionControl>()>;

/// Aimd's window: where it starts, its bounds, and what counts as congestion.
struct AimdOptions {
    std::uint32_t initial = 4;     ///< the window before any answer
    std::uint32_t least = 1;       ///< it never shrinks below
    std::uint32_t most = 1u << 16; ///< nor grows above (the credits bound it too)
    /// A round-trip sample above this counts as congestion (queues building up), as a
    /// timeout does; 0: only timeouts do.
    std::chrono::nanoseconds high_rtt{0};
};

/// Additive increase, multiplicative decrease of the window: +1 packet after each
/// window's worth of answers; halved on congestion (a timeout, or a round trip above
/// high_rtt), at most once per window's worth of answers (one loss or one queue
/// episode is not several).
/// @threadsafety Called on its endpoint's thread only.
class Aimd final : public CongestionControl {
public:
    /// A window of `options.initial` packets.
    /// @misuse least 0, least > initial, or initial > most.
    explicit Aimd(AimdOptions options = {}, std::source_location where = std::source_location::current());

    /// The window now, between least and most.
    std::uint32_t window() const noexcept override { return window_; }
    /// Counts the answer towards the next +1; a round trip above high_rtt halves the
    /// window (once per window's worth of answers).
    void answered(std::optional<std::chrono::nanoseconds> round_trip) noexcept override;
    /// Halves the window, not below least (once per window's worth of answers).
    void timed_out() noexcept override;

private:
    void shrink() noexcept;

    AimdOptions options_;
    std::uint32_t window_;
    std::uint32_t answers_ = 0;      // since the window last grew or shrank
    bool shrunk_this_window_ = false; // shrunk, and not a window of answers since
};

} // namespace rdmaxx::rpc
