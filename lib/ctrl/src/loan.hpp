// A region lent or granted to the peer, and the key the peer holds to it: a memory
// window bound to exactly its bytes, or a registration of its bytes made for the peer
// (ConnectionOptions' Lending; always for a region of its own registration, whose own
// key would outlive the loan when the region is handed back).
//
// revoke() destroys the window or the registration made for the peer, so the key dies
// while the owner still holds the memory; destroying a Loan does the same before the
// region goes (back to its pool, or deregistered and freed). Not thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <utility>

#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/mw.hpp>

namespace rdmaxx::detail {

class Loan {
public:
    Loan(MemoryRegion region, MemoryWindow window) noexcept
        : region_(std::move(region)), window_(std::move(window)) {}
    Loan(MemoryRegion region, MemoryRegion registration) noexcept
        : region_(std::move(region)), registration_(std::move(registration)) {}

    Loan(Loan&&) noexcept = default;
    // The key this loan held dies before its memory is given back (then the moves).
    Loan& operator=(Loan&& other) noexcept {
        if (this != &other) {
            revoke();
            region_ = std::move(other.region_);
            window_ = std::move(other.window_);
            registration_ = std::move(other.registration_);
        }
        return *this;
    }

    std::size_t size() const noexcept { return region_.size(); }
    void revoke() noexcept {
        window_.reset();
        registration_.reset();
    }
    // The region, the peer's key revoked.
    MemoryRegion take() && {
        revoke();
        return std::move(region_);
    }

private:
    // member order: the key goes before the memory it names
    MemoryRegion region_;
    std::optional<MemoryWindow> window_;
    std::optional<MemoryRegion> registration_;
};

} // namespace rdmaxx::detail
