#include "resolve.hpp"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <string>

#include <netdb.h>
#include <signal.h>

#include <fmt/format.h>

namespace rdmaxx::detail {
namespace {

// One getaddrinfo_a request, owned by the caller and by glibc's completion
// notification: whichever lets go last frees it, so a caller that gives up at its
// deadline leaves nothing for the resolver thread to write into.
struct Lookup {
    std::atomic<int> owners{2};
    std::string name;
    std::string service;
    addrinfo hints{};
    gaicb request{};
    sigevent notify{};
};

void release(Lookup* lookup) {
    if (lookup->owners.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        if (lookup->request.ar_result)
            freeaddrinfo(lookup->request.ar_result);
        delete lookup;
    }
}

void lookup_done(sigval value) { release(static_cast<Lookup*>(value.sival_ptr)); }

std::vector<SocketAddress> copy(const addrinfo* list) {
    std::vector<SocketAddress> addresses;
    for (const addrinfo* a = list; a; a = a->ai_next) {
        if (a->ai_addrlen > sizeof(sockaddr_storage))
            continue;
        SocketAddress address{.family = a->ai_family, .storage = {}, .length = a->ai_addrlen};
        std::memcpy(&address.storage, a->ai_addr, a->ai_addrlen);
        addresses.push_back(address);
    }
    return addresses;
}

Error lookup_error(int rc, std::string_view host, std::uint16_t port) {
    return Error::from_errno("getaddrinfo", EHOSTUNREACH, fmt::format("{}:{}: {}", host, port, gai_strerror(rc)));
}

} // namespace

Result<std::vector<SocketAddress>> resolve_host(std::string_view host, std::uint16_t port, int family, bool passive,
                                                Clock::time_point deadline) {
    const bool any = host.empty() || host == "*";
    addrinfo hints{};
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = (passive ? AI_PASSIVE : 0) | AI_NUMERICSERV;
    const std::string name(host);
    const std::string service = std::to_string(port);
    // a numeric address (or every address): no lookup, nothing to wait for
    addrinfo numeric_hints = hints;
    numeric_hints.ai_flags |= AI_NUMERICHOST;
    addrinfo* list = nullptr;
    if (const int rc = getaddrinfo(any ? nullptr : name.c_str(), service.c_str(), &numeric_hints, &list); rc == 0) {
        auto addresses = copy(list);
        freeaddrinfo(list);
        return addresses;
    } else if (any || rc != EAI_NONAME) {
        return std::unexpected(lookup_error(rc, host, port));
    }

    auto* lookup = new Lookup;
    lookup->name = name;
    lookup->service = service;
    lookup->hints = hints;
    lookup->request.ar_name = lookup->name.c_str();
    lookup->request.ar_service = lookup->service.c_str();
    lookup->request.ar_request = &lookup->hints;
    lookup->notify.sigev_notify = SIGEV_THREAD;
    lookup->notify.sigev_notify_function = &lookup_done;
    lookup->notify.sigev_value.sival_ptr = lookup;
    gaicb* requests[] = {&lookup->request};
    if (const int rc = getaddrinfo_a(GAI_NOWAIT, requests, 1, &lookup->notify); rc != 0) {
        delete lookup; // not queued: no notification will come
        return std::unexpected(lookup_error(rc, host, port));
    }
    for (;;) {
        const auto left = std::max(Clock::duration::zero(), deadline - Clock::now());
        const auto seconds = std::chrono::floor<std::chrono::seconds>(left);
        const timespec wait{.tv_sec = static_cast<std::time_t>(seconds.count()),
                            .tv_nsec = static_cast<long>(std::chrono::nanoseconds(left - seconds).count())};
        const int rc = gai_suspend(requests, 1, &wait);
        if (rc == EAI_INTR)
            continue;
        if (const int status = gai_error(&lookup->request); status != EAI_INPROGRESS) {
            Result<std::vector<SocketAddress>> result = std::unexpected(lookup_error(status, host, port));
            if (status == 0)
                result = copy(lookup->request.ar_result);
            release(lookup);
            return result;
        }
        if (Clock::now() >= deadline) {
            // a request cancelled before it ran is never notified: both references are ours
            if (gai_cancel(&lookup->request) == EAI_CANCELED)
                release(lookup);
            release(lookup);
            return std::unexpected(
                Error::timeout("getaddrinfo", fmt::format("{}:{}: no answer from the resolver in time", host, port)));
        }
    }
}

} // namespace rdmaxx::detail
