// rdmaxx-perf's RPC tests (rpc_lat, rpc_bw): lib/rpc's calls measured as the device's
// tests are, to set beside perftest's UD and RC sends. The server is an rpc::Endpoint
// with an echo handler; the client an endpoint with `sessions` sessions to it and
// `window` callers per session, each a coroutine making one call after another.
//
//   rpc_lat  one session, one call at a time: each call's whole round trip, from the
//            gaps between the starts of consecutive calls (as perftest stamps its posts)
//   rpc_bw   sessions x window calls in flight: calls per second (the message rate)
//            and the requests' bytes per second
//
// Every response is checked: its size, its caller's call number in its first bytes,
// and each caller's last response byte for byte.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <asio/io_context.hpp>

#include <rdmaxx/rpc/endpoint.hpp>

#include "options.hpp"
#include "report.hpp"
#include "runs.hpp"

namespace rdmaxx::perf {

class RpcSide {
public:
    // The client: its endpoint and sessions to options.host:options.port (a refused
    // connection is tried again until options.timeout: the server may be starting).
    static Result<RpcSide> connect(const Options& options);
    // The server: its endpoint listening on options.port, with the echo handler.
    static Result<RpcSide> accept(const Options& options);

    const Options& options() const noexcept { return options_; }
    const Setup& setup() const noexcept { return setup_; }

private:
    friend Result<Figures> run_client(RpcSide& side, std::uint32_t size, std::uint32_t iters);
    friend Result<void> finish_client(RpcSide& side);
    friend Result<std::uint32_t> serve(RpcSide& side);
    RpcSide(Options options, std::unique_ptr<asio::io_context> io, std::unique_ptr<rpc::Endpoint> endpoint);

    Options options_;
    std::unique_ptr<asio::io_context> io_;     // outlives the endpoint
    std::unique_ptr<rpc::Endpoint> endpoint_;  // outlives its sessions
    std::vector<rpc::Session> sessions_;
    Setup setup_;
};

// Client: one run of `iters` calls of `size` bytes each way per session.
Result<Figures> run_client(RpcSide& side, std::uint32_t size, std::uint32_t iters);
// Client: ends its sessions (the server's signal to end).
Result<void> finish_client(RpcSide& side);
// Server: serves until it has had sessions and they all ended (or none came within
// two minutes, an Error); how many calls it handled.
Result<std::uint32_t> serve(RpcSide& side);

} // namespace rdmaxx::perf
