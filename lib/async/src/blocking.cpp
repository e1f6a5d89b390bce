#include <rdmaxx/async/blocking.hpp>

namespace rdmaxx::async::detail {
namespace {

// The helper threads as a service of the io_context: its shutdown, the first step of
// its destruction, joins them (the calls under way finish) before the io_context
// destroys the coroutines waiting for them.
class BlockingThreads : public asio::execution_context::service {
public:
    static inline asio::execution_context::id id;
    explicit BlockingThreads(asio::execution_context& context) : service(context) {}
    asio::thread_pool& pool() noexcept { return pool_; }

private:
    void shutdown() override { pool_.join(); }
    asio::thread_pool pool_{4};
};

} // namespace

asio::thread_pool& blocking_threads(asio::execution_context& context) {
    return asio::use_service<BlockingThreads>(context).pool();
}

} // namespace rdmaxx::async::detail
