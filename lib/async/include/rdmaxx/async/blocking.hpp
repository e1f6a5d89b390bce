/// @file
/// A call that waits in the kernel or in librdmacm, run off the io_context's thread.
///
/// Some verbs calls wait for the network. On RoCE an address handle towards a GID, and
/// an RC QP's move to RTR towards one, resolve the GID's MAC address (ARP, neighbour
/// discovery) inside the call: about a second when nobody answers (rxe: 1.02 s, every
/// time, then an error), and as long the first time for a host that does answer.
/// librdmacm's address and route resolution and its connect wait for the peer. On the
/// io_context's thread such a wait stalls every operation and timer the io_context
/// runs, and where the GID came from the network a peer can cause it at will.
/// run_blocking() runs the call on helper threads of the io_context instead, and
/// resumes the caller on its own executor.
///
/// The helpers: four threads per io_context (asio::execution_context), made at the
/// first run_blocking() on it, shared by every call on it, in order. A call waits for a
/// free one: four calls waiting a second each delay the next by up to a second, never
/// the io_context's own work. A call cannot be cancelled: its caller resumes when it
/// returns. A call a peer causes takes a PeerTurn first: such calls take two of the
/// helpers at most, so peers who announce addresses nobody answers for slow the
/// setups behind theirs (N of them about N/2 seconds), never the io_context's sessions
/// and timers, nor the application's own calls.
/// Like Asio's resolver, the io_context's shutdown (its destruction) waits for the
/// calls under way before it destroys the coroutines they would resume.
///
/// @code
/// // a GID a peer announced: no stall of the io_context if nobody answers for it
/// auto make = [&] { return rdmaxx::AddressHandle::create(pd, announced, local_gid, port, layer); };
/// auto ah = co_await rdmaxx::async::run_blocking(make, "my_setup");
/// @endcode
///
/// @threadsafety run_blocking: as the io_context. `call` runs on a helper thread while
/// its caller waits: it may touch what its caller owns (the caller's frame stays as it
/// is until the call returns), but nothing that the io_context's other work uses
/// meanwhile, unless that is thread-safe (verbs objects are, rdmaxx's wrappers as their
/// headers say).
#pragma once

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/execution_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/this_coro.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>

#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::async {

class PeerTurn;

namespace detail {
/// The helper threads of `context` (made at the first call).
asio::thread_pool& blocking_threads(asio::execution_context& context);

/// The helpers' share for calls peers cause (PeerTurn), per io_context.
struct PeerShare {
    static constexpr std::uint32_t helpers = 2; ///< of the four
    /// A lane with turns held or waited for.
    struct Lane {
        std::uint32_t turns = 0;      ///< held or waited for
        std::uint64_t last_given = 0; ///< `given` when it last got one (0: not yet)
    };
    std::uint32_t running = 0;                        ///< turns held
    std::deque<PeerTurn*> waiting;                    ///< in order of arrival
    std::unordered_map<std::string, Lane> lanes;      ///< by name
    std::uint64_t given = 0;                          ///< turns given so far: the lanes' clock
    bool shut_down = false;                           ///< the io_context is going: nothing is handed over
};
PeerShare& peer_share(asio::execution_context& context);
} // namespace detail

/// `call()` (returning a Result) on a helper thread of the caller's io_context; what it
/// returned, on the caller's executor. `call` is a named object, never a temporary:
/// g++ 12 destroys a temporary with a destructor in a co_await's expression twice (a
/// lambda holding a shared_ptr left its count one short).
///
/// @errors What `call` returns; ENOMEM (named `caller`) if the hand-over or the call
/// threw (std::bad_alloc: rdmaxx throws nothing else).
template <class Call>
    requires requires(Call& c) { c().error(); }
asio::awaitable<std::invoke_result_t<Call&>> run_blocking(Call& call, const char* caller) {
    using R = std::invoke_result_t<Call&>;
    const auto executor = co_await asio::this_coro::executor;
    asio::thread_pool& helpers = detail::blocking_threads(asio::query(executor, asio::execution::context));
    // what it is unless the call returns: the hand-over or the call threw
    R result = std::unexpected(Error::from_errno(caller, ENOMEM, "a call on a helper thread threw"));
    co_await asio::co_spawn(
        helpers, [&call, &result]() -> asio::awaitable<void> { result = call(); co_return; },
        asio::experimental::as_tuple(asio::use_awaitable));
    co_return result;
}

/// A turn at the helpers for a call that a peer causes: a handle towards an address the
/// peer announced, an RC QP's move to RTR towards it (a second on a helper each when
/// nobody answers for the address). Such calls take at most two of an io_context's four
/// helpers at once, whoever makes them (every endpoint and listener on the io_context),
/// so that the other two stay free for the application's own calls (its connects)
/// however many peers announce such addresses at once. The others wait for a turn, each
/// until its deadline.
///
/// A turn is taken in a lane, the peer host it is for (rdmaxx::peer_host(): lib/rpc's of
/// the address its control connection comes from, async::Listener's of its client's). A
/// turn given back goes to the lane that has waited longest since its last turn, to
/// that lane's first waiting: one host's peers, however many, delay another host's by
/// one turn at most at each helper, not by all of theirs. Within a lane, and for turns
/// taken without one, the order is arrival.
///
/// @code
/// rdmaxx::async::PeerTurn turn;
/// if (co_await turn.take(deadline, peer_host)) // false: the deadline passed first
///     auto ah = co_await rdmaxx::async::run_blocking(make, "my_listener");
/// // the turn goes to the next lane's first waiting when `turn` is destroyed
/// @endcode
///
/// @threadsafety As the io_context, which one thread runs: every turn on it is taken
/// and given back there.
class PeerTurn {
public:
    PeerTurn() = default;
    PeerTurn(const PeerTurn&) = delete;
    PeerTurn& operator=(const PeerTurn&) = delete;
    /// A turn held goes to the first waiting; a wait under way (its coroutine destroyed
    /// with the io_context) leaves the queue.
    ~PeerTurn();

    /// Waits for the turn, on the caller's io_context, once per PeerTurn, in `lane`
    /// (every turn without one shares the lane ""). True: it is this one's until
    /// destroyed. False: `deadline` passed first (a turn handed over as it passed too:
    /// the call would begin past its bound; a deadline past already, with no turn free,
    /// at once), or cancel() ended the wait.
    asio::awaitable<bool> take(std::chrono::steady_clock::time_point deadline, std::string_view lane = {});
    /// Ends a wait under way without the turn (take() returns false): whoever waited
    /// is going away. Nothing if none is under way.
    void cancel() noexcept;

private:
    // Gives the turn given back to the waiting one whose lane has waited longest.
    static void hand_over(detail::PeerShare& share);

    detail::PeerShare* share_ = nullptr;    // from take() on: its lane counts this turn
    std::string lane_;
    asio::steady_timer* waiting_ = nullptr; // take()'s, while it waits
    bool held_ = false;
};

} // namespace rdmaxx::async
