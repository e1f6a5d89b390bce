#include <rdmaxx/async/blocking.hpp>

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

asio::awaitable<bool> PeerTurn::take(std::chrono::steady_clock::time_point deadline) {
    const auto executor = co_await asio::this_coro::executor;
    share_ = &detail::peer_share(asio::query(executor, asio::execution::context));
    if (share_->running < detail::PeerShare::helpers && share_->waiting.empty()) {
        ++share_->running;
        held_ = true;
        co_return true;
    }
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

PeerTurn::~PeerTurn() {
    if (share_ == nullptr || share_->shut_down)
        return;
    if (!held_) {
        if (waiting_ != nullptr)
            std::erase(share_->waiting, this);
        return;
    }
    if (share_->waiting.empty()) {
        --share_->running;
        return;
    }
    PeerTurn* next = share_->waiting.front();
    share_->waiting.pop_front();
    next->held_ = true;
    next->waiting_->cancel();
}

} // namespace rdmaxx::async
