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
// Pure bookkeeping, tested on the host; the listener finds and drops the client. Every
// call takes constant time (hashing the host aside), however many hosts hold slots: the
// hosts are kept in buckets by how many they hold, so that a flood from a thousand hosts
// costs a newcomer no scan of them. Not thread-safe (one listener's).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace rdmaxx::detail {

class HostShares {
public:
    // A slot taken, or given back, by a client of `host`.
    void add(const std::string& host) {
        const auto it = held_.try_emplace(host, 0).first;
        rebucket(it->first, it->second, it->second + 1);
        ++it->second;
    }
    void remove(const std::string& host) {
        const auto it = held_.find(host);
        if (it == held_.end())
            return;
        rebucket(it->first, it->second, it->second - 1);
        if (--it->second == 0)
            held_.erase(it);
    }
    std::uint32_t held_by(const std::string& host) const {
        const auto it = held_.find(host);
        return it == held_.end() ? 0 : it->second;
    }

    // With every slot taken: the host that gives one up to a newcomer from `host`, one
    // holding the most when it holds at least two more than `host` (after the swap they
    // are at most level); none otherwise (the newcomer is turned away).
    std::optional<std::string> yielding_to(const std::string& host) const {
        if (most_ == 0 || most_ < held_by(host) + 2)
            return std::nullopt;
        return **holding_[most_].begin();
    }

private:
    // `host` (a key of held_) goes from the bucket of those holding `from` to `to`'s.
    void rebucket(const std::string& host, std::uint32_t from, std::uint32_t to) {
        if (from > 0)
            holding_[from].erase(&host);
        if (to > 0) {
            if (holding_.size() <= to)
                holding_.resize(to + 1);
            holding_[to].insert(&host);
        }
        if (to > most_)
            most_ = to;
        else if (from == most_ && holding_[from].empty())
            most_ = to; // it was the last holding the most: now it holds one fewer
    }

    std::unordered_map<std::string, std::uint32_t> held_; // hosts holding none are absent
    // holding_[n]: the hosts holding n slots (keys of held_, whose nodes stay put)
    std::vector<std::unordered_set<const std::string*>> holding_;
    std::uint32_t most_ = 0; // the most any host holds
};

} // namespace rdmaxx::detail
