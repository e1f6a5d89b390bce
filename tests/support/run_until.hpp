// Driving an io_context from a test's own thread: until a condition holds, within a
// bound (the io_context restarted whenever it runs out of work meanwhile).
#pragma once

#include <chrono>

#include <asio/io_context.hpp>

namespace rdmaxx::test {

// Runs `io` until `done()` holds or `bound` has passed; whether `done()` holds.
template <class Done>
bool run_until(asio::io_context& io, Done&& done, std::chrono::milliseconds bound) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
        io.restart();
        io.run_for(std::chrono::milliseconds(5));
    }
    return done();
}

} // namespace rdmaxx::test
