// Which device events end which waits (AsyncEvents::check's rules), on made-up times.
#include <cerrno>
#include <chrono>
#include <string>

#include <doctest/doctest.h>

#include <rdmaxx/data/events.hpp>
#include <rdmaxx/data/fatal_events.hpp>

using namespace rdmaxx;
using detail::EventScope;
using detail::FatalEvents;
using Time = FatalEvents::Time;
using std::chrono::seconds;

namespace {

const Time t0{};
int cq_one = 0, cq_two = 0; // stand-ins for two ibv_cq addresses
const auto* first_cq = reinterpret_cast<const ibv_cq*>(&cq_one);
const auto* second_cq = reinterpret_cast<const ibv_cq*>(&cq_two);

// a QP event of a QP whose send and receive CQs are first_cq
AsyncEvent qp_event(AsyncEventType type, std::uint32_t qp_num) {
    return {.type = type, .qp_num = qp_num, .qp_send_cq = first_cq, .qp_recv_cq = first_cq};
}
AsyncEvent port_event(AsyncEventType type, std::uint8_t port) { return {.type = type, .port = port}; }

} // namespace

TEST_CASE("a QP's fatal event ends waits on that QP only (or on its CQs), and only on the QP it was read for") {
    FatalEvents log;
    log.remember(qp_event(AsyncEventType::qp_fatal, 0x11), t0 + seconds(10));
    // the QP created before the event was read: the event is its own
    CHECK(log.find({.qp_num = 0x11, .qp_created = t0 + seconds(5)}));
    CHECK(log.find({.qp_num = 0x11, .qp_created = t0 + seconds(5)})->type == AsyncEventType::qp_fatal);
    CHECK_FALSE(log.find({.qp_num = 0x12, .qp_created = t0}));
    // a later QP that reuses the number: the event concerned its predecessor
    CHECK_FALSE(log.find({.qp_num = 0x11, .qp_created = t0 + seconds(11)}));
    // a wait on any QP of a CQ sees it, if it was read since the CQ was made
    CHECK(log.find({.cq = first_cq, .cq_created = t0 + seconds(1)}));
    CHECK_FALSE(log.find({.cq = first_cq, .cq_created = t0 + seconds(20)}));
    // and if the QP completes into that CQ: another CQ's waits go on (they all failed)
    CHECK_FALSE(log.find({.cq = second_cq, .cq_created = t0 + seconds(1)}));
    FatalEvents receives;
    receives.remember({.type = AsyncEventType::qp_fatal, .qp_num = 0x13, .qp_send_cq = first_cq,
                       .qp_recv_cq = second_cq}, t0 + seconds(10));
    CHECK(receives.find({.cq = second_cq, .cq_created = t0 + seconds(1)}));
    CHECK(receives.find({.cq = first_cq, .cq_created = t0 + seconds(1)}));
    // events that do not kill (COMM_EST, SQ_DRAINED) end nothing
    FatalEvents mild;
    mild.remember(qp_event(AsyncEventType::comm_established, 0x11), t0 + seconds(10));
    mild.remember(qp_event(AsyncEventType::sq_drained, 0x11), t0 + seconds(10));
    CHECK_FALSE(mild.find({.qp_num = 0x11, .qp_created = t0}));
    CHECK_FALSE(mild.find({}));
}

TEST_CASE("a CQ error ends waits on that CQ only, and not on a CQ made later at the same address") {
    FatalEvents log;
    log.remember({.type = AsyncEventType::cq_error, .cq = first_cq}, t0 + seconds(10));
    CHECK(log.find({.cq = first_cq, .cq_created = t0 + seconds(1)})->type == AsyncEventType::cq_error);
    CHECK_FALSE(log.find({.cq = second_cq, .cq_created = t0 + seconds(1)}));
    CHECK_FALSE(log.find({.cq = first_cq, .cq_created = t0 + seconds(11)}));
    // a QP-only scope is not a wait on that CQ
    CHECK_FALSE(log.find({.qp_num = 0x11, .qp_created = t0}));
}

TEST_CASE("a port error ends waits on that port's QPs until the port is active again") {
    FatalEvents log;
    log.remember(port_event(AsyncEventType::port_error, 2), t0 + seconds(1));
    const auto on_port_two = log.find({.qp_num = 0x11, .port = 2});
    REQUIRE(on_port_two);
    CHECK(on_port_two->type == AsyncEventType::port_error);
    CHECK(on_port_two->port == 2);
    CHECK_FALSE(log.find({.qp_num = 0x11, .port = 1}));
    CHECK(log.find({})); // any port
    log.remember(port_event(AsyncEventType::gid_change, 2), t0 + seconds(2)); // not a recovery
    CHECK(log.find({.qp_num = 0x11, .port = 2}));
    log.remember(port_event(AsyncEventType::port_active, 2), t0 + seconds(3));
    CHECK_FALSE(log.find({.qp_num = 0x11, .port = 2}));
    CHECK_FALSE(log.find({}));
}

TEST_CASE("a fatal device error ends every wait; the log keeps the newest killing events") {
    FatalEvents log;
    for (std::uint32_t qp = 1; qp <= FatalEvents::capacity + 4; ++qp)
        log.remember(qp_event(AsyncEventType::qp_access_error, qp), t0 + seconds(qp));
    CHECK_FALSE(log.find({.qp_num = 1, .qp_created = t0})); // the oldest went
    CHECK(log.find({.qp_num = FatalEvents::capacity + 4, .qp_created = t0}));
    CHECK(log.find({.qp_num = 5, .qp_created = t0}));
    CHECK_FALSE(log.find({.qp_num = 4, .qp_created = t0}));
    log.remember({.type = AsyncEventType::device_fatal}, t0 + seconds(100));
    CHECK(log.find({.qp_num = 0x999, .qp_created = t0 + seconds(200)})->type == AsyncEventType::device_fatal);
    CHECK(log.find({.cq = second_cq, .cq_created = t0 + seconds(200)}));
}

TEST_CASE("the Error each killing event ends work with: one mapping for every reader") {
    const Error port = event_error(port_event(AsyncEventType::port_error, 2));
    CHECK(port.code() == ENETDOWN);
    CHECK(port.message().find("PORT_ERR: port 2 is down") != std::string::npos);
    const Error qp = event_error(qp_event(AsyncEventType::qp_access_error, 0x2a));
    CHECK(qp.code() == EIO);
    CHECK(qp.message().find("QP_ACCESS_ERR on QP 0x2a") != std::string::npos);
    CHECK(event_error({.type = AsyncEventType::cq_error, .cq = first_cq}).message().find("CQ_ERR") != std::string::npos);
    CHECK(event_error({.type = AsyncEventType::device_fatal}).code() == EIO);
}
