#include <rdmaxx/async/blocking.hpp>

#include <algorithm>

namespace rdmaxx::async::detail {
namespace {

// The helper threads as a service of the io_context: its shutdown, the first step of
// its destruction, joins them (the calls under way finish) before the io_context
// destroys the coroutines waiting for them, and their PeerTurns (which then hand
// nothing over: the timers they would cancel may be gone).
class BlockingThreads : public asio::execution_context::service {
public:
    static inline asio::execution_context::id id;
    explicit BlockingThreads(asio::execution_context& context) : service(context) {}
    asio::thread_pool& pool() noexcept { return pool_; }
    PeerShare& share() noexcept { return share_; }

private:
    void shutdown() override {
        share_.shut_down = true;
        pool_.join();
    }
    asio::thread_pool pool_{4};
    PeerShare share_;
};

} // namespace

asio::thread_pool& blocking_threads(asio::execution_context& context) {
    return asio::use_service<BlockingThreads>(context).pool();
}

PeerShare& peer_share(asio::execution_context& context) { return asio::use_service<BlockingThreads>(context).share(); }

} // namespace rdmaxx::async::detail

namespace rdmaxx::async {

asio::awaitable<bool> PeerTurn::take(std::chrono::steady_clock::time_point deadline, std::string_view lane) {
    lane_ = lane; // before the first suspension: the caller's string lives while it awaits
    const auto executor = co_await asio::this_coro::executor;
    share_ = &detail::peer_share(asio::query(executor, asio::execution::context));
    detail::PeerShare::Lane& mine = share_->lanes[lane_];
    ++mine.turns;
    if (share_->running < detail::PeerShare::helpers && share_->waiting.empty()) {
        ++share_->running;
        mine.last_given = ++share_->given;
        held_ = true;
        co_return true;
    }
    // past its deadline already: no place in the queue (a timer of that deadline ends
    // only at the reactor's next turn, which a loaded thread may be slow to give)
    if (deadline <= std::chrono::steady_clock::now())
        co_return false;
    asio::steady_timer timer(executor, deadline);
    waiting_ = &timer;
    share_->waiting.push_back(this);
    // cancelled: the turn handed over, or cancel()
    co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    waiting_ = nullptr;
    if (held_)
        co_return std::chrono::steady_clock::now() < deadline;
    std::erase(share_->waiting, this);
    co_return false;
}

void PeerTurn::cancel() noexcept {
    if (waiting_ != nullptr)
        waiting_->cancel();
}

void PeerTurn::hand_over(detail::PeerShare& share) {
    // the first waiting of the lane given a turn longest ago (a lane not given one yet
    // first): the lanes in turn, each in order of arrival
    auto next = share.waiting.begin();
    std::uint64_t oldest = share.lanes.at((*next)->lane_).last_given;
    for (auto it = std::next(next); it != share.waiting.end() && oldest != 0; ++it)
        if (const std::uint64_t last = share.lanes.at((*it)->lane_).last_given; last < oldest) {
            next = it;
            oldest = last;
        }
    PeerTurn* turn = *next;
    share.waiting.erase(next);
    share.lanes.at(turn->lane_).last_given = ++share.given;
    turn->held_ = true;
    turn->waiting_->cancel();
}

PeerTurn::~PeerTurn() {
    if (share_ == nullptr || share_->shut_down)
        return;
    if (auto lane = share_->lanes.find(lane_); --lane->second.turns == 0)
        share_->lanes.erase(lane);
    if (!held_) {
        if (waiting_ != nullptr)
            std::erase(share_->waiting, this);
        return;
    }
    if (share_->waiting.empty()) {
        --share_->running;
        return;
    }
    hand_over(*share_);
}

} // namespace rdmaxx::async
