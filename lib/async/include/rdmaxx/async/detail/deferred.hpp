// Completions that the Completions service runs when its driver handler ends (a busy
// CQ's turn, an event CQ's wake) instead of posting them to the io_context, whose next
// turn would first run the reactor (an epoll_wait: on rxe a few microseconds of an RPC's
// round trip). A FIFO of type-erased handlers in HandlerMemory blocks, linked through
// the blocks themselves: no allocation once warm. Internal to lib/async and lib/rpc.
#pragma once

#include <rdmaxx/async/detail/handler_memory.hpp>

#include <new>
#include <utility>

namespace rdmaxx::async::detail {

// A deferred handler's link and its type-erased end (run it, or destroy it uncalled).
struct DeferredOp {
    DeferredOp* next = nullptr;
    void (*end)(DeferredOp* op, bool run) = nullptr;
};

template <class Handler>
struct DeferredHandler : DeferredOp {
    Handler handler;
    HandlerMemory* memory;

    DeferredHandler(Handler&& h, HandlerMemory& m) : DeferredOp{nullptr, &finish}, handler(std::move(h)), memory(&m) {}

    // The block is free before the handler runs: the handler may defer another.
    static void finish(DeferredOp* op, bool run) {
        auto* self = static_cast<DeferredHandler*>(op);
        Handler handler(std::move(self->handler));
        HandlerMemory& memory = *self->memory;
        self->~DeferredHandler();
        memory.deallocate(self, sizeof(DeferredHandler));
        if (run)
            std::move(handler)();
    }
};

// The FIFO (one per Completions service, used by the thread that runs its io_context).
class DeferredQueue {
public:
    DeferredQueue() = default;
    DeferredQueue(const DeferredQueue&) = delete;
    DeferredQueue& operator=(const DeferredQueue&) = delete;

    template <class Handler>
    void push(HandlerMemory& memory, Handler&& handler) {
        using Op = DeferredHandler<std::decay_t<Handler>>;
        auto* op = new (memory.allocate(sizeof(Op))) Op(std::forward<Handler>(handler), memory);
        (tail_ != nullptr ? tail_->next : head_) = op;
        tail_ = op;
    }
    bool empty() const noexcept { return head_ == nullptr; }
    // All of them, oldest first, linked by `next` (nullptr: none); the queue is empty.
    DeferredOp* take_all() noexcept {
        tail_ = nullptr;
        return std::exchange(head_, nullptr);
    }
    // `chain` (linked by `next`) ahead of the queued ones.
    void put_back(DeferredOp* chain) noexcept {
        if (chain == nullptr)
            return;
        DeferredOp* last = chain;
        while (last->next != nullptr)
            last = last->next;
        last->next = head_;
        if (head_ == nullptr)
            tail_ = last;
        head_ = chain;
    }
    // The oldest, unlinked; empty() must be false.
    DeferredOp* pop() noexcept {
        DeferredOp* op = std::exchange(head_, head_->next);
        if (head_ == nullptr)
            tail_ = nullptr;
        return op;
    }

private:
    DeferredOp* head_ = nullptr;
    DeferredOp* tail_ = nullptr;
};

} // namespace rdmaxx::async::detail
