// The owner's side of lending: which of its regions the peer may access, until when,
// and how much of its memory the peer's requests pin.
//
// A region is lent (send_local_mr) or granted (allocated on the peer's request, counted
// against the quota). It stays registered, so reachable by the peer, until one of:
//   - its lease ends: expire() destroys it (deregistration: a late access fails at the
//     NIC) before its memory can be reused;
//   - the peer gives it back: its exposure is revoked at once (Region::revoke(): the
//     window or registration the peer used is destroyed), and it waits in the returned
//     queue, still counted, until the owner takes it (take_returned()).
// So the quota counts what is really pinned for the peer: a peer looping request/return
// fills it unless the owner takes the regions back. What a grant counts (its charge) is
// the caller's to say: what the region really costs, more than the bytes asked for.
//
// Time comes in as an argument (no clock inside): lease expiry is tested on the host
// with made-up time points. The earliest lease end is kept: expire(), called on every
// pump of the connection's CQ, and next_expiry() cost one comparison until a lease
// ends; finding a token given back, and the ends after one, scan the leases. `Region`
// is Loan in the library (anything with revoke() and move construction in tests). Not
// thread-safe (one Link's).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace rdmaxx::detail {

template <class Region, class TimePoint = std::chrono::steady_clock::time_point>
class LeaseTable {
public:
    explicit LeaseTable(std::uint64_t quota_bytes) noexcept : quota_(quota_bytes) {}

    // Whether a grant of `bytes` fits the quota now.
    bool fits(std::uint64_t bytes) const noexcept { return bytes <= quota_ - std::min(quota_, pinned_); }

    // Lends (charge 0: the owner's own choice, not counted) or grants `region` under
    // `token` until `expires`, counting `charge` bytes against the quota.
    void add(std::uint64_t token, Region region, TimePoint expires, std::uint64_t charge) {
        pinned_ += charge;
        if (!earliest_ || expires < *earliest_)
            earliest_ = expires;
        leases_.push_back({token, std::move(region), expires, charge});
    }

    // The peer gives `token` back: false when no live lease has it (expired, returned
    // already, never lent).
    bool give_back(std::uint64_t token) {
        const auto it = std::find_if(leases_.begin(), leases_.end(), [&](const Lease& l) { return l.token == token; });
        if (it == leases_.end())
            return false;
        it->region.revoke();
        const bool was_earliest = !(*earliest_ < it->expires);
        returned_.push_back(std::move(*it));
        leases_.erase(it);
        if (was_earliest)
            find_earliest();
        return true;
    }

    // The oldest region given back, now the owner's alone (no longer counted).
    std::optional<Region> take_returned() {
        if (returned_.empty())
            return std::nullopt;
        Lease lease = std::move(returned_.front());
        returned_.pop_front();
        pinned_ -= lease.charge;
        return std::move(lease.region);
    }
    bool has_returned() const noexcept { return !returned_.empty(); }

    // Destroys the regions whose lease ended by `now`; returns how many.
    std::size_t expire(TimePoint now) {
        if (!earliest_ || now < *earliest_)
            return 0;
        const std::size_t ended = std::erase_if(leases_, [&](Lease& l) {
            if (now < l.expires)
                return false;
            pinned_ -= l.charge;
            return true;
        });
        find_earliest();
        return ended;
    }

    // The earliest lease end, for a caller that sleeps until something happens.
    std::optional<TimePoint> next_expiry() const { return earliest_; }

    // The charges of the regions granted on request and not yet taken back by the owner
    // (lent regions are the owner's own choice and are not counted).
    std::uint64_t pinned_for_peer() const noexcept { return pinned_; }
    std::size_t live() const noexcept { return leases_.size(); }

private:
    struct Lease {
        std::uint64_t token;
        Region region;
        TimePoint expires;
        std::uint64_t charge;
    };
    void find_earliest() {
        earliest_.reset();
        for (const Lease& l : leases_)
            if (!earliest_ || l.expires < *earliest_)
                earliest_ = l.expires;
    }

    std::uint64_t quota_;
    std::uint64_t pinned_ = 0;
    std::vector<Lease> leases_;
    std::optional<TimePoint> earliest_; // of leases_
    std::deque<Lease> returned_;
};

} // namespace rdmaxx::detail
