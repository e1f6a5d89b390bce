// async::PeerTurn (rdmaxx/async/blocking.hpp): two turns at once per io_context, the
// others lane by lane, each until its deadline. No helper thread runs: the turns alone.
#include <array>
#include <chrono>
#include <optional>
#include <string>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <doctest/doctest.h>

#include <rdmaxx/async/blocking.hpp>
#include <rdmaxx/async/deadline.hpp>

namespace {

using Clock = std::chrono::steady_clock;
using rdmaxx::async::PeerTurn;

const Clock::time_point never = Clock::time_point::max();

// One caller of take(): what it got, in what order the turns came, and its turn held
// until `release` is cancelled.
struct Caller {
    explicit Caller(asio::io_context& io) : release(io, never) {}
    std::optional<bool> taken;
    int order = -1; // among the callers that got a turn
    PeerTurn* turn = nullptr;
    asio::steady_timer release;
};

asio::awaitable<void> take_and_hold(Caller* caller, Clock::time_point deadline, int* turns_given, std::string lane) {
    PeerTurn turn;
    caller->turn = &turn;
    caller->taken = co_await turn.take(deadline, lane);
    if (*caller->taken)
        caller->order = (*turns_given)++;
    co_await caller->release.async_wait(rdmaxx::async::no_throw);
    caller->turn = nullptr;
}

// Runs what is ready (an io_context out of work stops: restarted first).
void drive(asio::io_context& io) {
    io.restart();
    io.poll();
}

void start(asio::io_context& io, Caller& caller, Clock::time_point deadline, int& turns_given,
           std::string lane = {}) {
    asio::co_spawn(io, take_and_hold(&caller, deadline, &turns_given, std::move(lane)), asio::detached);
    drive(io);
}

} // namespace

TEST_CASE("peer turns: two at once per io_context, the others in order as turns are given back") {
    asio::io_context io;
    int given = 0;
    std::array<Caller, 4> callers{Caller(io), Caller(io), Caller(io), Caller(io)};
    for (Caller& caller : callers)
        start(io, caller, never, given);
    CHECK(callers[0].taken == true);
    CHECK(callers[1].taken == true);
    CHECK_FALSE(callers[2].taken.has_value());
    CHECK_FALSE(callers[3].taken.has_value());
    callers[1].release.cancel();
    drive(io);
    CHECK(callers[2].taken == true);
    CHECK_FALSE(callers[3].taken.has_value());
    callers[0].release.cancel();
    drive(io);
    CHECK(callers[3].taken == true);
    CHECK(callers[3].order == 3);
    // both given back with nobody waiting: the next two take theirs at once
    callers[2].release.cancel();
    callers[3].release.cancel();
    drive(io);
    Caller fifth(io), sixth(io);
    start(io, fifth, never, given);
    start(io, sixth, never, given);
    CHECK(fifth.taken == true);
    CHECK(sixth.taken == true);
    fifth.release.cancel();
    sixth.release.cancel();
    drive(io);
}

TEST_CASE("peer turns: a wait past its deadline, or cancelled, ends without the turn and leaves the queue") {
    asio::io_context io;
    int given = 0;
    Caller first(io), second(io), late(io), cancelled(io), next(io);
    start(io, first, never, given);
    start(io, second, never, given);
    start(io, late, Clock::now() - std::chrono::seconds(1), given);
    CHECK(late.taken == false);
    start(io, cancelled, never, given);
    CHECK_FALSE(cancelled.taken.has_value());
    start(io, next, never, given);
    REQUIRE(cancelled.turn != nullptr);
    cancelled.turn->cancel();
    drive(io);
    CHECK(cancelled.taken == false);
    first.release.cancel(); // the turn goes to the one still waiting
    drive(io);
    CHECK(next.taken == true);
    for (Caller* caller : {&second, &late, &cancelled, &next})
        caller->release.cancel();
    drive(io);
}

// One host's peers (a lane) hold both turns and four more wait; a second host's first
// comes last, yet gets the next turn given back, and a third host's the one after; then
// the first host's waiting ones, in their order, as their lane is the only one left.
TEST_CASE("peer turns: a turn given back goes to the lane that waited longest, each lane in order") {
    asio::io_context io;
    int given = 0;
    std::array<Caller, 6> crowd{Caller(io), Caller(io), Caller(io), Caller(io), Caller(io), Caller(io)};
    for (Caller& caller : crowd)
        start(io, caller, never, given, "192.0.2.7");
    Caller other_host(io), third_host(io), other_host_again(io);
    start(io, other_host, never, given, "198.51.100.1");
    start(io, third_host, never, given, "203.0.113.5");
    start(io, other_host_again, never, given, "198.51.100.1");
    CHECK(crowd[0].taken == true);
    CHECK(crowd[1].taken == true);
    crowd[0].release.cancel();
    drive(io);
    CHECK(other_host.taken == true); // ahead of the crowd's four, there first
    CHECK_FALSE(third_host.taken.has_value());
    crowd[1].release.cancel();
    drive(io);
    CHECK(third_host.taken == true);
    CHECK_FALSE(crowd[2].taken.has_value());
    other_host.release.cancel();
    drive(io);
    CHECK(crowd[2].taken == true); // its lane's last turn is older than the other host's
    CHECK_FALSE(other_host_again.taken.has_value());
    third_host.release.cancel();
    drive(io);
    CHECK(other_host_again.taken == true);
    for (Caller* caller : {&crowd[2], &other_host_again}) {
        caller->release.cancel();
        drive(io);
    }
    // the crowd's lane alone: in its order
    CHECK(crowd[3].taken == true);
    CHECK(crowd[4].taken == true);
    CHECK(crowd[3].order < crowd[4].order);
    crowd[3].release.cancel();
    drive(io);
    CHECK(crowd[5].taken == true);
    CHECK(crowd[4].order < crowd[5].order);
    for (Caller* caller : {&crowd[4], &crowd[5]})
        caller->release.cancel();
    drive(io);
}

TEST_CASE("peer turns: each io_context has its own two") {
    asio::io_context one, other;
    int given = 0;
    Caller a(one), b(one), c(other), d(other);
    start(one, a, never, given);
    start(one, b, never, given);
    start(other, c, never, given);
    start(other, d, never, given);
    CHECK(a.taken == true);
    CHECK(b.taken == true);
    CHECK(c.taken == true);
    CHECK(d.taken == true);
    for (Caller* caller : {&a, &b, &c, &d})
        caller->release.cancel();
    drive(one);
    drive(other);
}

// What the sanitizers' build checks: the coroutines destroyed with the io_context
// (their timers' waits cancelled first, as a frame's locals would be) touch no turn
// or timer that is gone.
TEST_CASE("peer turns: an io_context destroyed with turns held and waited for hands nothing over") {
    int given = 0;
    asio::io_context io;
    Caller held(io), also_held(io), waiting(io);
    start(io, held, never, given);
    start(io, also_held, never, given);
    start(io, waiting, never, given);
    CHECK(held.taken == true);
    CHECK(also_held.taken == true);
    CHECK_FALSE(waiting.taken.has_value());
}
