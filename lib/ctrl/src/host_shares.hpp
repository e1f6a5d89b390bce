// A listener's clients in progress (a Listener's pending handshakes, an rpc::Endpoint's
// setups), counted by the host each comes from (peer_host()), so that the slots
// (max_pending_handshakes, max_sessions) are shared out fairly when they run short.
// When every slot is taken, a client from a host holding at least two fewer than the
// host holding the most takes one of that host's: the listener drops that host's oldest
// client that can go. So one host opening clients faster than they finish (silent ones,
// or ones whose connects wait for a turn at the helpers) ends up holding about as many
// slots as each other host that asks, never all of them; hosts asking for less keep
// what they ask for. Under no pressure nothing changes: one host may hold every slot
// while nobody else asks.
//
// Pure bookkeeping, tested on the host; the listener finds and drops the client.
// Finding the host holding the most scans the hosts holding slots (a one-host flood: one
// or two). Not thread-safe (one listener's).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

namespace rdmaxx::detail {

class HostShares {
public:
    // A slot taken, or given back, by a client of `host`.
    void add(const std::string& host) { ++held_[host]; }
    void remove(const std::string& host) {
        if (const auto it = held_.find(host); it != held_.end() && --it->second == 0)
            held_.erase(it);
    }
    std::uint32_t held_by(const std::string& host) const {
        const auto it = held_.find(host);
        return it == held_.end() ? 0 : it->second;
    }

    // With every slot taken: the host that gives one up to a newcomer from `host`, the
    // one holding the most when it holds at least two more than `host` (after the swap
    // they are at most level); none otherwise (the newcomer is turned away).
    std::optional<std::string> yielding_to(const std::string& host) const {
        const std::string* most = nullptr;
        std::uint32_t most_held = 0;
        for (const auto& [holder, held] : held_)
            if (held > most_held) {
                most = &holder;
                most_held = held;
            }
        if (most == nullptr || most_held < held_by(host) + 2)
            return std::nullopt;
        return *most;
    }

private:
    std::unordered_map<std::string, std::uint32_t> held_; // hosts holding none are absent
};

} // namespace rdmaxx::detail
