// The memory of the handlers rdmaxx hands to Asio on its hot paths (a busy CQ's polling
// turn, the channel wait, lib/rpc's stored calls, their completions and its ticker):
// blocks of one size, recycled through a free list. Internal to lib/async and lib/rpc.
//
// Why not Asio's recycling allocator: its per-thread cache keeps two blocks per purpose,
// and when neither is large enough it frees one and allocates anew (with aligned_alloc,
// which a counting operator new does not see). With a polling turn and a completion of
// different sizes posted in turn, that was an allocation and a free per RPC.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace rdmaxx::async::detail {

// One per io_context (the Completions service owns it), used by the thread that runs
// that io_context only. Outlives every handler allocated from it: the service is
// destroyed after every service has shut down (which destroys the pending handlers).
class HandlerMemory {
public:
    // Room for Asio's operation around a handler of rdmaxx's (the largest: a call's
    // completion, its handler and its Result). Larger requests go to operator new, which
    // the zero-allocation tests count.
    static constexpr std::size_t block_size = 512;

    HandlerMemory() = default;
    HandlerMemory(const HandlerMemory&) = delete;
    HandlerMemory& operator=(const HandlerMemory&) = delete;
    ~HandlerMemory() {
        while (free_ != nullptr)
            ::operator delete(std::exchange(free_, free_->next), block_size);
    }

    void* allocate(std::size_t size) {
        if (size > block_size || free_ == nullptr) [[unlikely]]
            return ::operator new(size > block_size ? size : block_size);
        return std::exchange(free_, free_->next);
    }
    void deallocate(void* p, std::size_t size) noexcept {
        if (size > block_size) [[unlikely]] {
            ::operator delete(p, size);
            return;
        }
        free_ = new (p) Block{free_};
    }
private:
    struct Block {
        Block* next;
    };
    Block* free_ = nullptr;
};

// A standard allocator over a HandlerMemory (WithMemory's associated allocator).
template <class T>
class HandlerAllocator {
public:
    using value_type = T;

    explicit HandlerAllocator(HandlerMemory& memory) noexcept : memory_(&memory) {}
    template <class U>
    HandlerAllocator(const HandlerAllocator<U>& other) noexcept : memory_(other.memory()) {}

    T* allocate(std::size_t n) {
        static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
        return static_cast<T*>(memory_->allocate(n * sizeof(T)));
    }
    void deallocate(T* p, std::size_t n) noexcept { memory_->deallocate(p, n * sizeof(T)); }
    HandlerMemory* memory() const noexcept { return memory_; }
    friend bool operator==(const HandlerAllocator& a, const HandlerAllocator& b) noexcept {
        return a.memory_ == b.memory_;
    }

private:
    HandlerMemory* memory_;
};

// `handler` with its memory in a HandlerMemory (its associated allocator) and no other
// association: posted to an executor, it runs there directly. (asio::bind_allocator
// forwards the executor association too, which makes asio::post wrap the handler in a
// work dispatcher: an atomic work count and a second dispatch per post.)
template <class Handler>
struct WithMemory {
    using allocator_type = HandlerAllocator<void>;
    Handler handler;
    HandlerMemory* memory;

    allocator_type get_allocator() const noexcept { return allocator_type(*memory); }
    template <class... Args>
    void operator()(Args&&... args) {
        handler(std::forward<Args>(args)...);
    }
};

template <class Handler>
WithMemory<std::decay_t<Handler>> with_memory(HandlerMemory& memory, Handler&& handler) {
    return {std::forward<Handler>(handler), &memory};
}

} // namespace rdmaxx::async::detail
