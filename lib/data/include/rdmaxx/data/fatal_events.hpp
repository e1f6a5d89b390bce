/// @file
/// What AsyncEvents remembers of the events that kill work, and whom each concerns.
/// An event concerns an object only if it was read after the object was created: the
/// kernel drops a destroyed QP's or CQ's unread events (and ibv_destroy_* waits for the
/// read ones to be acknowledged), so an event read earlier is about an older object
/// that had the same QP number or the same address. Pure logic, tested on the host.
#pragma once

#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

#include <rdmaxx/data/async_event.hpp>

namespace rdmaxx::detail {

// The objects a wait depends on. Unset fields mean "any": a wait on a CQ shared by
// many QPs ends on the fatal event of any QP whose send or receive CQ it is, read since
// the CQ was created, and on any port's error.
struct EventScope {
    using Time = std::chrono::steady_clock::time_point;
    std::uint32_t qp_num = 0; // 0: any QP
    Time qp_created{};
    const void* cq = nullptr; // the ibv_cq; nullptr: none
    Time cq_created{};
    std::uint8_t port = 0; // 0: any port
};

class FatalEvents {
public:
    using Time = EventScope::Time;
    static constexpr std::size_t capacity = 16;

    // Takes note of an event read at `read_at` (events are read in time order).
    void remember(const AsyncEvent& event, Time read_at) noexcept {
        if (event.port != 0 && event.port < 32) {
            if (event.type == AsyncEventType::port_error)
                ports_down_ |= 1u << event.port;
            else if (event.type == AsyncEventType::port_active)
                ports_down_ &= ~(1u << event.port);
        }
        if (event.type == AsyncEventType::device_fatal)
            device_fatal_ = true;
        if (!event.kills(event.qp_num) || event.type == AsyncEventType::port_error ||
            event.type == AsyncEventType::device_fatal)
            return;
        if (count_ == capacity) { // keep the newest
            for (std::size_t i = 1; i < capacity; ++i)
                entries_[i - 1] = entries_[i];
            --count_;
        }
        entries_[count_++] = {event, read_at};
    }

    // The event that ended work in `scope`, if one did. A port that is down is
    // reported as its port_error event.
    std::optional<AsyncEvent> find(const EventScope& scope) const noexcept {
        if (device_fatal_)
            return AsyncEvent{.type = AsyncEventType::device_fatal};
        const std::uint32_t ports = scope.port == 0 ? ports_down_ : ports_down_ & (1u << scope.port);
        if (ports != 0)
            return AsyncEvent{.type = AsyncEventType::port_error, .port = static_cast<std::uint8_t>(std::countr_zero(ports))};
        for (std::size_t i = count_; i-- > 0;) {
            const Entry& e = entries_[i];
            if (e.event.type == AsyncEventType::cq_error) {
                if (scope.cq != nullptr && e.event.cq == scope.cq && e.read_at >= scope.cq_created)
                    return e.event;
            } else if (scope.qp_num == 0 ? e.read_at >= scope.cq_created && feeds(e.event, scope.cq)
                                          : e.event.qp_num == scope.qp_num && e.read_at >= scope.qp_created) {
                return e.event;
            }
        }
        return std::nullopt;
    }

private:
    // Whether the QP of `event` completes into `cq` (nullptr: any CQ). A dead QP of
    // another CQ leaves this one's completions coming.
    static bool feeds(const AsyncEvent& event, const void* cq) noexcept {
        return cq == nullptr || event.qp_send_cq == cq || event.qp_recv_cq == cq;
    }

    struct Entry {
        AsyncEvent event;
        Time read_at;
    };
    std::array<Entry, capacity> entries_{};
    std::size_t count_ = 0;
    std::uint32_t ports_down_ = 0; // bit p: port p is down
    bool device_fatal_ = false;
};

} // namespace rdmaxx::detail
