// The operation slab: one slot per posted (or credit-waiting) work request, its
// completion handler stored in the slot without a heap allocation, and a wr_id that
// names the slot and its generation. Internal to lib/async.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <source_location>
#include <type_traits>
#include <utility>
#include <vector>

#include <asio/associated_allocator.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/dispatch.hpp>
#include <asio/execution.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/recycling_allocator.hpp>

#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/post.hpp>

namespace rdmaxx::async::detail {

struct QpCore;

// What every operation completes with: its work completion, or why there is none.
using OpResult = Result<WorkCompletion>;

struct Op;
class OpSlab;

// How a stored handler is completed or dropped; one static table per handler type.
struct HandlerTable {
    // Moves the handler out of the slot, frees its storage and calls it with the
    // result: inline when `defer` is false and the handler's executor allows it (the
    // service's poll loop, already on the io_context's thread), else posted.
    void (*complete)(Op& op, OpResult&& result, bool defer, OpSlab& slab);
    // Destroys the handler uncalled (the io_context is shutting down).
    void (*destroy)(Op& op) noexcept;
};

// A receive WR with room for its SGEs.
struct RecvWr {
    ibv_recv_wr wr;
    std::array<ibv_sge, rdmaxx::detail::max_sge> sge;
};

// A prebuilt SendBatch posted as one operation: type-erased, since a batch's size is
// its type. `post` gives every WR the operation's wr_id, signals the last one only
// and posts them all.
struct BatchRef {
    void* batch;
    // posts it; `accepted` receives how many WRs the device took (all, or those before
    // the one it refused); `first` its first WR (a flush marker's UD destination)
    Result<void> (*post)(void* batch, std::uint64_t wr_id, std::size_t& accepted, const ibv_send_wr*& first,
                         std::source_location where);
};

struct Op {
    // waiting: for queue entries; held: given its entries, to be posted with the other
    // sends started by the handlers of the same poll (one doorbell; completions.hpp)
    enum class State : std::uint8_t { free, waiting, held, posted };
    enum class Kind : std::uint8_t { send, batch, recv };

    std::uint32_t index = 0;
    std::uint32_t generation = 1;
    State state = State::free;
    Kind kind = Kind::send;
    bool cancelled = false; // a terminal cancellation moved the QP to error for this op
    bool completes_by_flush = false; // its post failed with WRs the device may have taken
    std::uint32_t credits = 0; // queue entries this op holds (or waits for)
    QpCore* qp = nullptr;
    Op* prev = nullptr; // the free list (next only), a QP's credit queue or its held sends
    Op* next = nullptr;
    const char* call = "";
    std::source_location where;

    const HandlerTable* table = nullptr;
    void* handler = nullptr; // in `inline_` or from the recycling allocator
    std::size_t handler_size = 0;
    alignas(std::max_align_t) std::array<std::byte, 96> inline_;

    // what is posted when the op's credits come
    union {
        rdmaxx::detail::SendWr send;
        RecvWr recv;
        BatchRef batch;
    } wr;

    std::uint64_t wr_id() const noexcept { return (std::uint64_t{generation} << 32) | index; }
};

// Slots in chunks that never move (a posted WR names its slot by index); a free list.
// Grows only when more operations are in flight than ever before.
class OpSlab {
public:
    Op& acquire() {
        if (free_ == nullptr)
            grow();
        Op& op = *free_;
        free_ = op.next;
        op.next = op.prev = nullptr;
        op.cancelled = false;
        op.completes_by_flush = false;
        ++in_use_;
        return op;
    }
    // The slot's generation changes: a late completion that names it is stale.
    void release(Op& op) noexcept {
        op.state = Op::State::free;
        op.qp = nullptr;
        ++op.generation;
        op.next = free_;
        free_ = &op;
        --in_use_;
    }
    // The op a wr_id names, if it is posted and of this generation; else nullptr.
    Op* find(std::uint64_t wr_id) noexcept {
        const auto index = static_cast<std::uint32_t>(wr_id);
        const auto generation = static_cast<std::uint32_t>(wr_id >> 32);
        if (index >= chunks_.size() * chunk_size)
            return nullptr;
        Op& op = (*chunks_[index / chunk_size])[index % chunk_size];
        return op.generation == generation && op.state == Op::State::posted ? &op : nullptr;
    }
    Op* at(std::uint32_t index, std::uint32_t generation) noexcept {
        if (index >= chunks_.size() * chunk_size)
            return nullptr;
        Op& op = (*chunks_[index / chunk_size])[index % chunk_size];
        return op.generation == generation && op.state != Op::State::free ? &op : nullptr;
    }
    std::size_t in_use() const noexcept { return in_use_; }
    std::size_t capacity() const noexcept { return chunks_.size() * chunk_size; }

private:
    static constexpr std::size_t chunk_size = 256;
    using Chunk = std::array<Op, chunk_size>;
    [[gnu::noinline]] void grow() {
        const auto base = static_cast<std::uint32_t>(chunks_.size() * chunk_size);
        chunks_.push_back(std::make_unique<Chunk>());
        Chunk& chunk = *chunks_.back();
        for (std::size_t i = chunk_size; i-- > 0;) {
            chunk[i].index = base + static_cast<std::uint32_t>(i);
            chunk[i].next = free_;
            free_ = &chunk[i];
        }
    }

    std::vector<std::unique_ptr<Chunk>> chunks_;
    Op* free_ = nullptr;
    std::size_t in_use_ = 0;
};

// The storage a handler lives in while its operation is in flight, with the work
// guard of the executor it will run on (Asio's rule: an operation in flight keeps its
// handler's executor busy).
template <class Handler, class IoExecutor>
struct HandlerBox {
    using Executor = asio::associated_executor_t<Handler, IoExecutor>;
    using WorkExecutor = std::decay_t<decltype(asio::prefer(std::declval<Executor>(),
                                                            asio::execution::outstanding_work.tracked))>;

    template <class H>
    HandlerBox(H&& h, const IoExecutor& io) : handler(std::forward<H>(h)), io(io) {
        const Executor executor = asio::get_associated_executor(handler, io);
        if (!on_io(executor, io))
            work.emplace(asio::prefer(executor, asio::execution::outstanding_work.tracked));
    }

    Handler handler;
    // Asio's rule: an operation keeps its handler's executor from running out of work
    // until the handler is called. Needed only for a handler bound to another execution
    // context: the service keeps its own io_context running while operations are in
    // flight (a drive handler is pending), and skipping it saves an atomic count (and,
    // for an any_io_executor, a type-erased call) per operation.
    std::optional<WorkExecutor> work;
    IoExecutor io; // the service's io_context

    static bool on_io(const Executor& executor, const IoExecutor& io) noexcept {
        return &asio::query(executor, asio::execution::context) == &asio::query(io, asio::execution::context);
    }

    static constexpr bool fits_inline = sizeof(HandlerBox) <= sizeof(Op::inline_) &&
                                        alignof(HandlerBox) <= alignof(std::max_align_t) &&
                                        std::is_nothrow_move_constructible_v<Handler>;

    // `h` forwarded into the slot: moved (or copied) once, since an awaitable_handler's
    // moved-from shell costs a destructor call per move
    template <class H>
    static void store(Op& op, H&& h, const IoExecutor& io);
    static void complete(Op& op, OpResult&& result, bool defer, OpSlab& slab);
    static void destroy(Op& op) noexcept;
    static constexpr HandlerTable table{&complete, &destroy};

private:
    static void release(Op& op, HandlerBox* box) noexcept {
        box->~HandlerBox();
        if (op.handler != op.inline_.data()) {
            asio::recycling_allocator<std::byte> alloc;
            alloc.deallocate(static_cast<std::byte*>(op.handler), sizeof(HandlerBox));
        }
        op.handler = nullptr;
        op.table = nullptr;
    }
};

template <class Handler, class IoExecutor>
template <class H>
void HandlerBox<Handler, IoExecutor>::store(Op& op, H&& h, const IoExecutor& io) {
    void* memory = op.inline_.data();
    if constexpr (!fits_inline) {
        // Asio's thread-local recycling cache: no heap after the first operations
        asio::recycling_allocator<std::byte> alloc;
        memory = alloc.allocate(sizeof(HandlerBox));
    }
    op.handler = new (memory) HandlerBox(std::forward<H>(h), io);
    op.table = &table;
}

template <class Handler, class IoExecutor>
void HandlerBox<Handler, IoExecutor>::complete(Op& op, OpResult&& result, bool defer, OpSlab& slab) {
    auto* box = static_cast<HandlerBox*>(op.handler);
    // Asio's rule: the operation's memory is free before its handler runs (which may
    // start the next operation in the same slot)
    Handler handler(std::move(box->handler));
    std::optional<WorkExecutor> work(std::move(box->work));
    const IoExecutor io = box->io;
    release(op, box);
    slab.release(op);
    asio::get_associated_cancellation_slot(handler).clear();
    // What dispatch() would do, without wrapping the call for a type-erased executor:
    // on the io_context's own thread, a handler bound to that io_context runs inline.
    if (!defer && !work && io.running_in_this_thread()) {
        std::move(handler)(std::move(result));
        return;
    }
    struct Call {
        Handler handler;
        OpResult result;
        void operator()() { std::move(handler)(std::move(result)); }
    };
    const Executor executor = asio::get_associated_executor(handler, io); // `work` held until it has the call
    if (defer)
        asio::post(executor, Call{std::move(handler), std::move(result)});
    else
        asio::dispatch(executor, Call{std::move(handler), std::move(result)});
}

template <class Handler, class IoExecutor>
void HandlerBox<Handler, IoExecutor>::destroy(Op& op) noexcept {
    auto* box = static_cast<HandlerBox*>(op.handler);
    asio::get_associated_cancellation_slot(box->handler).clear();
    release(op, box);
}

// A FIFO of ops (waiting for queue entries, or held for a doorbell), linked through the ops.
class OpQueue {
public:
    bool empty() const noexcept { return head_ == nullptr; }
    Op* front() const noexcept { return head_; }
    void push_back(Op& op) noexcept {
        op.next = nullptr;
        op.prev = tail_;
        (tail_ ? tail_->next : head_) = &op;
        tail_ = &op;
    }
    void remove(Op& op) noexcept {
        (op.prev ? op.prev->next : head_) = op.next;
        (op.next ? op.next->prev : tail_) = op.prev;
        op.next = op.prev = nullptr;
    }

private:
    Op* head_ = nullptr;
    Op* tail_ = nullptr;
};

} // namespace rdmaxx::async::detail
