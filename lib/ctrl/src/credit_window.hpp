// Credits: a sender never fills a receive queue the peer has not refilled, so there
// are no RNR retries. Each side starts with the peer's receive depth in credits, spends
// one per message, and gets credits back in the header of every message from the peer
// (the buffers the peer reposted since its last message).
//
// Three floors keep the conversation from jamming: a user message needs more than
// `user_reserve` credits, a control message (grants, acks) more than one, and the last
// credit is for a credit-only message. So both sides can always hand credits back, even
// when both spent everything else. A credit-only message goes once `flush_threshold`
// buffers wait to be reported; that threshold is at least 2, so answering a credit-only
// message (which took one buffer) never needs another: no ping-pong.
//
// The peer is held to the same rule: it may have sent at most our receive depth plus
// the credits we reported (received()); one more message is a protocol error, so a
// peer that ignores its credits cannot keep our receives busy at its own pace.
//
// Pure logic, no verbs: tested on the host. Not thread-safe (one Link's).
#pragma once

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::detail {

class CreditWindow {
public:
    static constexpr std::uint32_t user_reserve = 2;
    // Receive depths a side may announce: the smallest that lets a user message and a
    // credit-only message both make progress, and at most what a header can return.
    static constexpr std::uint32_t min_depth = user_reserve + 2;
    static constexpr std::uint32_t max_depth = 0x8000;

    enum class Use : std::uint8_t { user, control, credit_only };

    // `peer_depth`: the receives the peer posts (our starting credits), `own_depth`:
    // ours. Both within [min_depth, max_depth]: the caller checked (the peer's is
    // untrusted input, refused before this).
    CreditWindow(std::uint32_t peer_depth, std::uint32_t own_depth) noexcept
        : peer_depth_(peer_depth), available_(peer_depth), peer_holds_(own_depth),
          flush_threshold_(std::max<std::uint32_t>(2, std::min(own_depth / 2, own_depth - user_reserve))) {}

    // Whether a message of this use may be sent now.
    bool can_send(Use use) const noexcept {
        switch (use) {
        case Use::user: return available_ > user_reserve;
        case Use::control: return available_ > 1;
        case Use::credit_only: return available_ > 0;
        }
        return false;
    }
    // One credit spent; returns the credits to report in its header (all unreported).
    // Only after can_send().
    std::uint16_t spend() noexcept {
        --available_;
        const auto report = static_cast<std::uint16_t>(std::min<std::uint32_t>(unreported_, 0xffff));
        unreported_ -= report;
        peer_holds_ += report;
        return report;
    }
    // One credit spent by a WRITE_WITH_IMM, which has no header: the unreported
    // credits stay for the next message (spend() would report them into nothing).
    void spend_without_report() noexcept { --available_; }
    // Spent on a message whose post failed: the credit and the report are not lost.
    void unspend(std::uint16_t report) noexcept {
        ++available_;
        unreported_ += report;
        peer_holds_ -= report;
    }

    // A message (or a WRITE_WITH_IMM) of the peer's took one of our receives. More than
    // it held credits for is a lie.
    Result<void> received() {
        if (peer_holds_ == 0)
            return std::unexpected(Error::protocol(
                "Connection", "the peer sent a message without a credit (more than our receives and its reports)"));
        --peer_holds_;
        return {};
    }

    // Credits the peer returned. More than it could ever have had back is a lie.
    Result<void> returned(std::uint32_t credits) {
        if (credits > peer_depth_ - available_)
            return std::unexpected(Error::protocol(
                "Connection", fmt::format("the peer returned {} credits, {} were out", credits, peer_depth_ - available_)));
        available_ += credits;
        return {};
    }
    // One of our receive buffers reposted: a credit to report.
    void reposted() noexcept { ++unreported_; }

    // Whether to send a credit-only message now: enough buffers wait to be reported
    // and nothing else is about to carry them.
    bool wants_credit_message() const noexcept { return unreported_ >= flush_threshold_ && can_send(Use::credit_only); }

    std::uint32_t available() const noexcept { return available_; }
    std::uint32_t unreported() const noexcept { return unreported_; }

private:
    std::uint32_t peer_depth_;
    std::uint32_t available_;
    std::uint32_t unreported_ = 0;
    std::uint32_t peer_holds_; // credits the peer may still spend: our depth, then our reports
    std::uint32_t flush_threshold_;
};

} // namespace rdmaxx::detail
