/// @file
/// Task<T>, a lean coroutine, and use_task, the completion token that makes an
/// asynchronous operation of Asio's model (lib/rpc's calls, lib/async's operations,
/// Asio's own timers and sockets) something a Task co_awaits directly.
///
/// Why a second coroutine type beside asio::awaitable: Asio 1.22 (Debian 12's) starts
/// every operation an asio::awaitable awaits in a coroutine frame of its own, completes
/// that frame and pops it through its frame stack. On Soft-RoCE under emulation that is
/// ~350 more distinct instructions per lib/rpc round trip than a callback's completion
/// (bench/results/rpc-round-trip.md), and a round trip pays for each. A Task awaiting an
/// operation through use_task suspends itself only: the operation's handler holds the
/// Task's coroutine handle and resumes it, as a callback would run.
///
/// @code
/// rdmaxx::async::Task<void> client(rdmaxx::rpc::Session& session) {
///     for (;;) {
///         rdmaxx::Result<std::size_t> got =
///             co_await session.call(kGet, request, response, {}, rdmaxx::async::use_task);
///         ...
///     }
/// }
/// rdmaxx::async::spawn(io.get_executor(), client(session));
/// @endcode
///
/// The rules:
/// - A Task is lazy: its body runs when it is awaited (co_await task, from a Task) or
///   spawned (spawn(), which runs it on an executor and destroys its frame when it
///   returns). Awaiting one runs it at once, and the awaiting Task goes on when it
///   returns: in the same call if it returned without suspending (so a loop awaiting
///   Tasks that return at once takes no stack, whatever the optimisation: g++ -O0
///   makes no tail call of a symmetric transfer), else from its end.
/// - `co_await operation(..., use_task)` suspends the Task until the operation's
///   handler runs; its value is the handler's argument (several: a std::tuple; none:
///   void). The operation decides where that happens (lib/rpc: its endpoint's
///   io_context; Asio's objects: their executor), and the Task goes on there. So a Task
///   belongs to one thread: operations it awaits must complete on the thread that runs
///   it (an io_context run by one thread, which is lib/rpc's and lib/async's model).
/// - No cancellation: bound what a Task awaits by the operation's own timeout
///   (rpc::CallOptions::timeout, a timer). Where an operation's handler is destroyed
///   without running (its io_context destroyed while the operation was pending), the
///   spawned Task it would have resumed is destroyed with it, the Tasks it awaits and
///   their frames' objects in order, as Asio does with its awaitable's frames.
/// - rdmaxx throws nothing; an exception that leaves a Task's body (the application's)
///   terminates the program.
/// - Each Task started allocates its frame (operator new): the operations it awaits
///   through use_task allocate nothing of their own beyond what they do with a callback.
///
/// @threadsafety A Task and the operations it awaits: one thread, the one that resumes
/// it (above). Distinct Tasks on distinct threads: safe.
#pragma once

#include <coroutine>
#include <exception>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include <asio/async_result.hpp>
#include <asio/post.hpp>

namespace rdmaxx::async {

template <class T = void>
class Task;

namespace detail {

// What every Task's promise has: who awaits it, and the spawned Task at the bottom of
// its chain (destroyed whole if an operation's handler dies unrun).
class TaskPromiseBase {
public:
    std::suspend_always initial_suspend() const noexcept { return {}; }

    struct FinalAwaiter {
        bool await_ready() const noexcept { return false; }
        template <class Promise>
        void await_suspend(std::coroutine_handle<Promise> done) const noexcept {
            TaskPromiseBase& promise = done.promise();
            promise.done_ = true;
            if (!promise.continuation_)
                done.destroy(); // spawned: nobody awaits it
            else if (!promise.inline_)
                promise.continuation_.resume(); // it had suspended: its awaiter goes on from here
            // else its awaiter, still in await_suspend, goes on as that returns
        }
        void await_resume() const noexcept {}
    };
    FinalAwaiter final_suspend() const noexcept { return {}; }
    [[noreturn]] void unhandled_exception() const noexcept { std::terminate(); }

    std::coroutine_handle<> root() const noexcept { return root_; }

protected:
    template <class>
    friend class rdmaxx::async::Task;
    template <class Executor>
    friend void spawn_root(const Executor&, std::coroutine_handle<>, TaskPromiseBase&);

    std::coroutine_handle<> continuation_; // empty: spawned
    std::coroutine_handle<> root_;
    bool inline_ = false; // its awaiter is inside await_suspend (it has not suspended yet)
    bool done_ = false;   // it returned
};

template <class T>
class TaskPromise : public TaskPromiseBase {
public:
    Task<T> get_return_object() noexcept;
    template <class U>
    void return_value(U&& value) {
        value_.emplace(std::forward<U>(value));
    }
    T take() { return std::move(*value_); }

private:
    std::optional<T> value_;
};

template <>
class TaskPromise<void> : public TaskPromiseBase {
public:
    Task<void> get_return_object() noexcept;
    void return_void() const noexcept {}
    void take() const noexcept {}
};

// The spawned root of a chain, owned by a handler that will resume the chain until it
// runs: a handler destroyed unrun (its io_context destroyed first) destroys the chain.
class RootUntilRun {
public:
    explicit RootUntilRun(std::coroutine_handle<> root) noexcept : root_(root) {}
    RootUntilRun(RootUntilRun&& other) noexcept : root_(std::exchange(other.root_, {})) {}
    RootUntilRun& operator=(RootUntilRun&&) = delete;
    ~RootUntilRun() {
        if (root_)
            root_.destroy();
    }
    // The handler runs: the chain is no longer this one's to destroy.
    std::coroutine_handle<> release() noexcept { return std::exchange(root_, {}); }

private:
    std::coroutine_handle<> root_;
};

// Starts `root` on `executor`.
struct TaskStart {
    RootUntilRun root;
    void operator()() { root.release().resume(); }
};

template <class Executor>
void spawn_root(const Executor& executor, std::coroutine_handle<> root, TaskPromiseBase& promise) {
    promise.root_ = root;
    asio::post(executor, TaskStart{RootUntilRun(root)});
}

// An operation's handler arguments as a co_await's value.
template <class... Args>
struct AwaitedValue {
    using type = std::tuple<Args...>;
};
template <class Arg>
struct AwaitedValue<Arg> {
    using type = Arg;
};
template <>
struct AwaitedValue<> {
    using type = void;
};

// `co_await operation(..., use_task)`: the operation starts as the coroutine suspends,
// its handler stores the value and resumes the coroutine.
template <class Initiation, class InitArgs, class... Args>
class [[nodiscard]] OperationAwaiter {
public:
    using value_type = typename AwaitedValue<std::decay_t<Args>...>::type;

    OperationAwaiter(Initiation initiation, InitArgs args)
        : initiation_(std::move(initiation)), args_(std::move(args)) {}
    OperationAwaiter(OperationAwaiter&&) = default;
    OperationAwaiter& operator=(OperationAwaiter&&) = delete;

    // The handler: resumes the awaiting coroutine with the operation's result, once;
    // destroyed unrun, destroys the chain it would have resumed.
    class Resume {
    public:
        explicit Resume(OperationAwaiter* awaiter) noexcept : awaiter_(awaiter), root_(awaiter->root_) {}
        void operator()(Args... args) {
            root_.release();
            if constexpr (sizeof...(Args) == 0)
                awaiter_->value_.emplace();
            else
                awaiter_->value_.emplace(std::forward<Args>(args)...);
            awaiter_->waiting_.resume();
        }

    private:
        OperationAwaiter* awaiter_;
        RootUntilRun root_;
    };

    bool await_ready() const noexcept { return false; }
    template <class Promise>
    void await_suspend(std::coroutine_handle<Promise> waiting) {
        waiting_ = waiting;
        if constexpr (requires { waiting.promise().root(); })
            root_ = waiting.promise().root();
        else
            root_ = waiting;
        std::apply([this](auto&&... args) { std::move(initiation_)(Resume(this), std::move(args)...); },
                   std::move(args_));
    }
    value_type await_resume() {
        if constexpr (!std::is_void_v<value_type>)
            return std::move(*value_);
    }

private:
    using Stored = std::conditional_t<std::is_void_v<value_type>, std::tuple<>, value_type>;
    Initiation initiation_;
    InitArgs args_;
    std::coroutine_handle<> waiting_, root_;
    std::optional<Stored> value_;
};

} // namespace detail

/// A lazily started coroutine returning T (top of task.hpp). Owns its frame: destroying
/// an unstarted or finished Task destroys it. Move-only.
template <class T>
class [[nodiscard]] Task {
public:
    using promise_type = detail::TaskPromise<T>; ///< what makes a function returning Task a coroutine

    /// Takes over `other`'s coroutine; `other` is left empty.
    Task(Task&& other) noexcept : handle_(std::exchange(other.handle_, {})) {}
    /// Swaps the two Tasks' coroutines (this one's is destroyed with `other`).
    Task& operator=(Task&& other) noexcept {
        std::swap(handle_, other.handle_);
        return *this;
    }
    ~Task() {
        if (handle_)
            handle_.destroy();
    }

    /// From a Task: runs this one, and resumes the awaiting Task with its value when it
    /// returns. A Task is awaited once.
    auto operator co_await() && noexcept { return Awaiter{handle_}; }

private:
    struct Awaiter {
        std::coroutine_handle<promise_type> task;
        bool await_ready() const noexcept { return false; }
        // Runs the task; false (go on at once) if it returned without suspending.
        template <class Promise>
        bool await_suspend(std::coroutine_handle<Promise> waiting) const {
            promise_type& promise = task.promise();
            promise.continuation_ = waiting;
            promise.root_ = waiting.promise().root();
            promise.inline_ = true;
            task.resume();
            promise.inline_ = false;
            return !promise.done_;
        }
        T await_resume() const { return task.promise().take(); }
    };

    template <class Executor>
    friend void spawn(const Executor& executor, Task<void> task);
    friend promise_type;
    explicit Task(std::coroutine_handle<promise_type> handle) noexcept : handle_(handle) {}
    std::coroutine_handle<promise_type> handle_;
};

namespace detail {
template <class T>
Task<T> TaskPromise<T>::get_return_object() noexcept {
    return Task<T>(std::coroutine_handle<TaskPromise<T>>::from_promise(*this));
}
inline Task<void> TaskPromise<void>::get_return_object() noexcept {
    return Task<void>(std::coroutine_handle<TaskPromise<void>>::from_promise(*this));
}
} // namespace detail

/// Runs `task` on `executor` (posted: not inside this call) and destroys its frame when
/// it returns. Nobody awaits it: it reports what it must itself.
template <class Executor>
void spawn(const Executor& executor, Task<void> task) {
    const auto handle = std::exchange(task.handle_, {});
    detail::spawn_root(executor, handle, handle.promise());
}

/// The completion token of an operation a Task awaits (top of task.hpp).
struct use_task_t {
    constexpr use_task_t() noexcept = default;
};
inline constexpr use_task_t use_task; ///< `co_await operation(..., use_task)` from a Task

} // namespace rdmaxx::async

/// @cond
// Asio's hook for a completion token: an operation given use_task returns an awaiter,
// and starts as a Task awaits it (an awaiter never awaited starts nothing).
template <class... Args>
class asio::async_result<rdmaxx::async::use_task_t, void(Args...)> {
public:
    template <class Initiation, class... InitArgs>
    static auto initiate(Initiation&& initiation, rdmaxx::async::use_task_t, InitArgs&&... args) {
        return rdmaxx::async::detail::OperationAwaiter<std::decay_t<Initiation>, std::tuple<std::decay_t<InitArgs>...>,
                                                       Args...>(std::forward<Initiation>(initiation),
                                                                std::tuple<std::decay_t<InitArgs>...>(
                                                                    std::forward<InitArgs>(args)...));
    }
};
/// @endcond
