// A test's helper thread. doctest's REQUIRE, FAIL and must() throw to end the test
// case; thrown on a std::thread they call std::terminate, and a std::thread still
// joinable when a failed check unwinds the test does too: either way the run dies and
// names no check. Thread catches what its body throws (doctest has already recorded
// the failed check), rethrows it from join(), and joins when destroyed.
#pragma once

#include <exception>
#include <memory>
#include <thread>
#include <utility>

namespace rdmaxx::test {

class Thread {
public:
    Thread() = default;
    template <class Body>
    explicit Thread(Body body)
        : error_(std::make_unique<std::exception_ptr>()),
          thread_([error = error_.get(), body = std::move(body)]() mutable {
              try {
                  body();
              } catch (...) {
                  *error = std::current_exception();
              }
          }) {}
    Thread(Thread&&) noexcept = default;
    Thread& operator=(Thread&& other) noexcept {
        finish();
        error_ = std::move(other.error_);
        thread_ = std::move(other.thread_);
        return *this;
    }
    ~Thread() { finish(); }

    // Waits for the body and rethrows what it threw: a check failed on the thread
    // ends the test case here.
    void join() {
        thread_.join();
        if (auto error = std::exchange(*error_, nullptr))
            std::rethrow_exception(error);
    }

private:
    // Joins a thread nobody joined (a test unwinding from a failed check): its own
    // failure, if any, doctest has recorded already.
    void finish() noexcept {
        if (thread_.joinable())
            thread_.join();
    }

    std::unique_ptr<std::exception_ptr> error_; // where the body's exception goes, stable across moves
    std::thread thread_;
};

} // namespace rdmaxx::test
