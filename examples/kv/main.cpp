// kv: a small key-value store over lib/rpc, the kind of prototype rdmaxx is for.
//
//   kv --serve [-p PORT] [-d DEVICE] [--once] [--mode MODE] [--cm]
//   kv HOST [-p PORT] [-d DEVICE] [-n OPS] [-c CONCURRENT] [--keys K] [--value-size V]
//          [-w WINDOW] [--mode MODE] [--read-gets] [--cm]
//
// The server keeps a hash map and answers PUT and GET calls. It also keeps a mirror of
// the table that clients may READ (one-sided, the server's CPU not involved): it lends
// it, registered for remote READ only, to each client that connects to PORT + 1
// (lib/async's Connection, an hour's lease; at most 16 such readers at once, and a
// reader that asks the server for memory of its own is refused); --read-gets makes the client GET by
// READing the key's mirror slot, and by RPC when the slot cannot answer (torn by a
// concurrent PUT, holding another key, or empty). The client is a load
// generator: CONCURRENT coroutines on one thread, OPS calls in all, half PUTs and half
// GETs of K keys; every value is a function of its key, so every GET that finds its
// key is checked byte for byte. A progress line on a terminal, then a summary (calls
// per second, round-trip percentiles); the exit status says whether every call was right.
// --once: the server exits when its client's session ends. SIGINT or SIGTERM shuts the
// server down gracefully: its clients' calls in flight finish, new calls and sessions are
// refused (rpc::Endpoint::shutdown), then it exits with the summary. --cm (both sides):
// sessions and the mirror's connection are set up over RDMA CM instead of TCP (HOST is
// then an address of the RDMA device's netdev).
//
// Tuned as a load generator should be: every coroutine has a call in flight (the
// session's window is CONCURRENT unless -w says otherwise: with lib/rpc's default of 8,
// half of 16 coroutines wait for a slot), and the retransmissions and drops are in the
// summary. --mode: how each side's endpoint takes its completions; hybrid (the default
// here) spins 50 us, then sleeps on the completion channel; busy never sleeps (for
// processes on cores of their own, taskset; on a shared machine, such as Soft-RoCE in a
// 2-CPU VM, it takes the CPU the kernel's rxe needs); event always sleeps. Under load the
// round trip is the concurrency divided by the throughput (Little's law): 16 calls in
// flight at 2,000 calls/s wait 8 ms each, however fast one call alone is.
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <list>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <rdmaxx/async/connection.hpp>
#include <rdmaxx/rpc/endpoint.hpp>

#include "../tutorial.hpp"

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

using namespace rdmaxx;
using Clock = std::chrono::steady_clock;

namespace {

// The calls. PUT: [key length: 1 byte][key][value] -> empty. GET: [key] -> [1][value]
// when the key is there, [0] when not.
constexpr std::uint8_t put_call = 1, get_call = 2;

// The mirror for one-sided GETs: `mirror_slots` slots of `slot_bytes`; a key's slot is
// fnv1a(key) % mirror_slots, and a PUT rewrites its key's slot (a collision evicts the
// key there before: the hash map stays the truth). A slot:
//   [u64 version][u16 key length][u16 value length][u32 0][key: key_room bytes]
//   [value: value_room bytes][u64 fnv1a of every byte before it]
// in host order (both ends are this program on one kind of machine). A READ may race
// the server's write of the slot: the checksum tells a torn slot, whose GET goes by RPC.
constexpr std::size_t key_room = 32, value_room = 256;
constexpr std::size_t slot_bytes = 16 + key_room + value_room + 8;
constexpr std::uint32_t mirror_slots = 16384;

std::uint64_t fnv1a(std::span<const std::byte> bytes) {
    std::uint64_t h = 14695981039346656037ull;
    for (const std::byte b : bytes)
        h = (h ^ std::to_integer<std::uint64_t>(b)) * 1099511628211ull;
    return h;
}

std::size_t slot_of(std::string_view key) {
    return fnv1a(std::as_bytes(std::span(key.data(), key.size()))) % mirror_slots;
}

// Writes `key` and `value` into its slot (or, too large to mirror, empties the slot if
// it holds the key).
void mirror_put(std::span<std::byte> mirror, std::string_view key, std::span<const std::byte> value) {
    std::byte* slot = mirror.data() + slot_of(key) * slot_bytes;
    std::uint64_t version = 0;
    std::memcpy(&version, slot, 8);
    const bool fits = key.size() <= key_room && value.size() <= value_room;
    std::uint16_t held = 0;
    std::memcpy(&held, slot + 8, 2);
    if (!fits && (held != key.size() || std::memcmp(slot + 16, key.data(), key.size()) != 0))
        return; // another key's slot: left as it is
    const std::uint16_t key_length = fits ? static_cast<std::uint16_t>(key.size()) : 0;
    const std::uint16_t value_length = fits ? static_cast<std::uint16_t>(value.size()) : 0;
    ++version;
    std::memset(slot, 0, slot_bytes - 8);
    std::memcpy(slot, &version, 8);
    std::memcpy(slot + 8, &key_length, 2);
    std::memcpy(slot + 10, &value_length, 2);
    std::memcpy(slot + 16, key.data(), key_length);
    if (value_length > 0)
        std::memcpy(slot + 16 + key_room, value.data(), value_length);
    const std::uint64_t sum = fnv1a(std::span(slot, slot_bytes - 8));
    std::memcpy(slot + slot_bytes - 8, &sum, 8);
}

// What a READ of `key`'s slot says: its value, or nothing (torn, another key, empty).
std::optional<std::span<const std::byte>> mirror_get(std::span<const std::byte> slot, std::string_view key) {
    std::uint64_t sum = 0;
    std::memcpy(&sum, slot.data() + slot_bytes - 8, 8);
    if (sum != fnv1a(slot.first(slot_bytes - 8)))
        return std::nullopt;
    std::uint16_t key_length = 0, value_length = 0;
    std::memcpy(&key_length, slot.data() + 8, 2);
    std::memcpy(&value_length, slot.data() + 10, 2);
    if (key_length != key.size() || value_length > value_room ||
        std::memcmp(slot.data() + 16, key.data(), key.size()) != 0)
        return std::nullopt;
    return slot.subspan(16 + key_room, value_length);
}

struct Args {
    bool serve = false, once = false, read_gets = false;
    Transport transport = Transport::tcp; // of the sessions and the mirror's connection
    std::string host, device;
    std::uint16_t port = 31870;
    std::uint32_t ops = 20000, concurrent = 16, keys = 1000, value_size = 64;
    std::uint32_t window = 0; // 0: concurrent
    async::CompletionMode mode = async::CompletionMode::hybrid;
};

// The server agrees to any client's window up to this, and to twice as many packets
// in flight per session (a receive buffer each, for up to 8 such sessions).
constexpr std::uint32_t server_window = 256;

int usage() {
    std::fputs("usage: kv --serve [-p PORT] [-d DEVICE] [--once] [--mode hybrid|busy|event] [--cm]\n"
               "       kv HOST [-p PORT] [-d DEVICE] [-n OPS] [-c CONCURRENT] [--keys K] [--value-size V]\n"
               "               [-w WINDOW] [--mode hybrid|busy|event] [--read-gets] [--cm]\n",
               stderr);
    return 2;
}

bool parse(int argc, char** argv, Args& a) {
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
        const auto number = [&](std::uint32_t& out, std::uint32_t most) {
            if (value == nullptr || std::atoll(value) <= 0 || std::atoll(value) > most)
                return false;
            out = static_cast<std::uint32_t>(std::atoll(value));
            ++i;
            return true;
        };
        std::uint32_t port = 0;
        if (arg == "--serve")
            a.serve = true;
        else if (arg == "--once")
            a.once = true;
        else if (arg == "--read-gets")
            a.read_gets = true;
        else if (arg == "--cm")
            a.transport = Transport::rdma_cm;
        else if (arg == "-p") {
            if (!number(port, 65534)) // and PORT + 1
                return false;
            a.port = static_cast<std::uint16_t>(port);
        } else if (arg == "-n") {
            if (!number(a.ops, 1u << 30))
                return false;
        } else if (arg == "-c") {
            if (!number(a.concurrent, 1024))
                return false;
        } else if (arg == "--keys") {
            if (!number(a.keys, 1u << 24))
                return false;
        } else if (arg == "--value-size") {
            if (!number(a.value_size, 60000))
                return false;
        } else if (arg == "-w") {
            if (!number(a.window, server_window))
                return false;
        } else if (arg == "--mode" && value != nullptr) {
            const std::string_view mode = value;
            ++i;
            if (mode == "busy")
                a.mode = async::CompletionMode::busy;
            else if (mode == "event")
                a.mode = async::CompletionMode::event;
            else if (mode == "hybrid")
                a.mode = async::CompletionMode::hybrid;
            else
                return false;
        } else if (arg == "-d" && value != nullptr) {
            a.device = value;
            ++i;
        } else if (!arg.empty() && arg[0] != '-' && a.host.empty())
            a.host = arg;
        else
            return false;
    }
    return a.serve != !a.host.empty();
}

// ---------------------------------------------------------------------------------
// Server

// Readers of the mirror at once, at most: each holds a connection and a registration of
// the whole mirror, and the one lending makes (10 MiB pinned); one more is closed as it
// comes.
constexpr std::size_t max_readers = 16;

// The mirror's connections, each while its reader keeps it (the listener's options
// grant a reader nothing it asks for: request_remote_mr is refused).
using Readers = std::list<async::Connection>;

// Until the reader closes its connection (or its host goes), then it is forgotten. A
// reader has nothing to say: a message is dropped, and one that does not fit ends it.
asio::awaitable<void> keep_reader(Readers* readers, Readers::iterator reader) {
    std::array<std::byte, 64> said{};
    for (;;) {
        const auto got = co_await reader->receive(said, std::chrono::hours(24));
        if (!got && !got.error().is_timeout())
            break;
    }
    readers->erase(reader);
}

// Lends the mirror, for remote READ only, to each client that connects (an hour's
// lease), up to max_readers at once.
asio::awaitable<void> lend_mirror(async::Listener* listener, std::span<std::byte> mirror, Readers* readers) {
    for (;;) {
        auto connection = co_await listener->accept(std::chrono::hours(24));
        if (!connection) {
            if (connection.error().is_cancelled())
                co_return;
            continue; // a timeout, or a client's failed handshake: accept again
        }
        if (readers->size() >= max_readers)
            continue; // closed here
        auto region = connection->register_local_mr(mirror, Access::remote_read);
        if (!region) {
            fmt::print(stderr, "kv: registering the mirror for a reader: {}\n", region.error());
            continue;
        }
        if (auto lent = co_await connection->send_local_mr(std::move(*region), std::chrono::hours(1)); !lent) {
            fmt::print(stderr, "kv: lending the mirror: {}\n", lent.error());
            continue;
        }
        readers->push_back(std::move(*connection));
        asio::co_spawn(co_await asio::this_coro::executor, keep_reader(readers, std::prev(readers->end())),
                       tutorial::rethrow);
    }
}

// --once: stops the server once a client has come and every session is gone. Checked
// every 100 ms by a timer, and the io_context runs with run(): a loop of run_for() would
// set up Asio's thread bookkeeping around every handler, the calls' included.
asio::awaitable<void> stop_when_served(asio::io_context* io, rpc::Endpoint* server) {
    asio::steady_timer timer(*io);
    bool served = false;
    while (!served || server->sessions() > 0) {
        timer.expires_after(std::chrono::milliseconds(100));
        co_await timer.async_wait(asio::use_awaitable);
        served = served || server->sessions() > 0;
    }
    io->stop();
}

// SIGINT or SIGTERM: every session closes gracefully (its calls finish first), then the
// server stops. `shut` says whether the shutdown went well.
asio::awaitable<void> stop_on_signal(asio::io_context* io, rpc::Endpoint* server, bool* shut) {
    asio::signal_set signals(*io, SIGINT, SIGTERM);
    const auto [ec, number] = co_await signals.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    if (ec)
        co_return;
    fmt::print(stderr, "kv: signal {}: shutting down ({} sessions finish their calls)\n", number, server->sessions());
    auto done = co_await server->shutdown(std::chrono::seconds(5));
    if (!done)
        fmt::print(stderr, "kv: shutting down: {}\n", done.error());
    *shut = done.has_value();
    io->stop();
}

int serve(const Args& a) {
    // before the io_context: the registrations lent to readers go with it (their
    // connections close in its handlers), never after the memory they name
    std::unordered_map<std::string, std::string> table;
    std::vector<std::byte> mirror(std::size_t{mirror_slots} * slot_bytes);
    asio::io_context io;
    auto server = rpc::Endpoint::create(io, {.device = a.device, .listen_port = a.port,
                                             .session_transport = a.transport, .ring = 8 * 2 * server_window,
                                             .window = server_window, .credits = 2 * server_window,
                                             .drive = {.mode = a.mode}});
    if (!server) {
        fmt::print(stderr, "kv: {}\n", server.error());
        return 1;
    }
    auto listener = async::Listener::listen(io.get_executor(), "0.0.0.0", static_cast<std::uint16_t>(a.port + 1),
                                            {.transport = a.transport, .device = a.device,
                                             .access_ceiling = Access::none, .quota_bytes = 0,
                                             .max_lease = std::chrono::hours(1)});
    if (!listener) {
        fmt::print(stderr, "kv: {}\n", listener.error());
        return 1;
    }
    Readers readers;
    asio::co_spawn(io, lend_mirror(&*listener, mirror, &readers), tutorial::rethrow);
    // a request from the network is checked like any: a malformed one is answered with
    // nothing (the caller's error), never trusted
    (*server)->set_handler(put_call, [&table, &mirror](rpc::Request request, rpc::Responder responder) {
        const auto bytes = request.bytes();
        if (bytes.empty() || bytes.size() < 1 + std::to_integer<std::size_t>(bytes[0]))
            return; // dropped: the caller hears "handler dropped"
        const std::size_t key_length = std::to_integer<std::size_t>(bytes[0]);
        const auto* at = reinterpret_cast<const char*>(bytes.data());
        std::string key(at + 1, key_length);
        mirror_put(mirror, key, bytes.subspan(1 + key_length));
        table.insert_or_assign(std::move(key), std::string(at + 1 + key_length, bytes.size() - 1 - key_length));
        responder.respond({});
    });
    std::vector<std::byte> answer;
    (*server)->set_handler(get_call, [&table, &answer](rpc::Request request, rpc::Responder responder) {
        const auto bytes = request.bytes();
        const auto found = table.find(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
        answer.assign(1, std::byte{found != table.end()});
        if (found != table.end()) {
            const auto* value = reinterpret_cast<const std::byte*>(found->second.data());
            answer.insert(answer.end(), value, value + found->second.size());
        }
        responder.respond(answer);
    });
    fmt::print(stderr, "kv: serving on port {} ({}-byte packets), the table's mirror on port {}\n", a.port,
               (*server)->mtu(), a.port + 1);
    if (a.once)
        asio::co_spawn(io, stop_when_served(&io, server->get()), tutorial::rethrow);
    bool shut = true;
    asio::co_spawn(io, stop_on_signal(&io, server->get(), &shut), tutorial::rethrow);
    io.run(); // until a signal, or --once's end
    fmt::print(stderr, "kv: {} keys stored, {} calls handled\n", table.size(), (*server)->counters().handled);
    return shut ? 0 : 1;
}

// ---------------------------------------------------------------------------------
// Client

std::string key_of(std::uint32_t k) { return fmt::format("key-{:08}", k); }

// The value of a key: a function of the key alone, so any GET can be checked.
void value_of(std::uint32_t k, std::uint32_t size, std::vector<std::byte>& out) {
    out.resize(size);
    for (std::uint32_t i = 0; i < size; ++i)
        out[i] = static_cast<std::byte>((k * 2654435761u + i * 40503u) >> 13);
}

struct Load {
    std::uint64_t done = 0, puts = 0, hits = 0, misses = 0, wrong = 0, failed = 0;
    std::uint64_t read_hits = 0, read_fallbacks = 0; // GETs answered by a READ; READs that could not
    std::vector<double> round_trips_us;
    std::uint32_t workers_left = 0;
    bool session_lost = false;
};

// A failed GET or PUT: counted, and printed while there are few (a server that stalls
// would otherwise print one line per call in flight, every timeout).
constexpr std::uint64_t printed_failures = 10;
void count_failure(Load& load, std::string_view what, const Error& error) {
    ++load.failed;
    if (load.failed <= printed_failures)
        fmt::print(stderr, "\nkv: {}: {}{}\n", what, error,
                   load.failed == printed_failures ? " (more failures are counted in the summary only)" : "");
}

// --read-gets: the connection the server lent its mirror on, the mirror, and a slot's
// worth of registered memory per worker to READ into.
struct Reader {
    async::Connection connection;
    RemoteMr mirror;
    MemoryRegion slots;
};

// A GET by READ of the key's mirror slot: true when the slot answered (the value is
// checked); false when the GET must go by RPC.
asio::awaitable<bool> read_get(Reader* reader, std::uint32_t worker, std::uint32_t k, const std::string& key,
                               const Args* a, std::vector<std::byte>* value, Load* load) {
    const LocalSlice into = reader->slots.slice(std::size_t{worker} * slot_bytes, slot_bytes);
    const auto read = co_await reader->connection.read(into, reader->mirror.slice(slot_of(key) * slot_bytes, slot_bytes));
    if (!read) {
        count_failure(*load, fmt::format("READ of {}'s slot", key), read.error());
        co_return true;
    }
    const auto found = mirror_get(into.bytes(), key);
    if (!found) {
        ++load->read_fallbacks;
        co_return false;
    }
    value_of(k, a->value_size, *value);
    const bool right = std::ranges::equal(*found, *value);
    ++(right ? load->read_hits : load->wrong);
    co_return true;
}

asio::awaitable<void> worker(rpc::Session* session, Reader* reader, const Args* a, std::uint32_t calls,
                             std::uint32_t index, Load* load) {
    std::mt19937 random(index + 1);
    std::vector<std::byte> request, value, response(1 + a->value_size);
    for (std::uint32_t i = 0; i < calls; ++i) {
        const std::uint32_t k = random() % a->keys;
        const std::string key = key_of(k);
        const bool put = random() % 2 == 0;
        request.assign(reinterpret_cast<const std::byte*>(key.data()), reinterpret_cast<const std::byte*>(key.data()) + key.size());
        if (put) {
            value_of(k, a->value_size, value);
            request.insert(request.begin(), static_cast<std::byte>(key.size()));
            request.insert(request.end(), value.begin(), value.end());
        }
        const auto start = Clock::now();
        bool read_answered = false; // (g++ 12: no co_await inside && or ?:)
        if (!put && reader != nullptr)
            read_answered = co_await read_get(reader, index, k, key, a, &value, load);
        if (read_answered) {
            load->round_trips_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
            ++load->done;
            continue;
        }
        const auto got = co_await session->call(put ? put_call : get_call, request, response,
                                                {.timeout = std::chrono::seconds(10)});
        load->round_trips_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
        ++load->done;
        if (!got) {
            if (got.error().is_errno(ECONNRESET)) { // the session ended (or closes: the server shuts down)
                ++load->failed;
                if (!std::exchange(load->session_lost, true))
                    fmt::print(stderr, "\nkv: {} {}: {}: the workers stop\n", put ? "PUT" : "GET", key, got.error());
                break;
            }
            count_failure(*load, fmt::format("{} {}", put ? "PUT" : "GET", key), got.error());
        } else if (put) {
            ++load->puts;
        } else if (*got == 1 && response[0] == std::byte{0}) {
            ++load->misses;
        } else {
            value_of(k, a->value_size, value);
            const bool right = *got == 1 + value.size() && response[0] == std::byte{1} &&
                               std::equal(value.begin(), value.end(), response.begin() + 1);
            ++(right ? load->hits : load->wrong);
        }
    }
    --load->workers_left;
}

// Connects to the server's mirror (PORT + 1) and takes the lease it lends.
asio::awaitable<Result<Reader>> lend_me_the_mirror(asio::any_io_executor executor, const Args* a) {
    ConnectionOptions options; // (g++ 12: no braced initializer inside a co_await)
    options.transport = a->transport;
    options.device = a->device;
    options.access_ceiling = Access::none; // the server gets nothing it might ask for
    options.quota_bytes = 0;
    auto connection =
        co_await async::Connection::connect(executor, a->host, static_cast<std::uint16_t>(a->port + 1), options);
    if (!connection)
        co_return std::unexpected(std::move(connection.error()));
    auto mirror = co_await connection->receive_remote_mr();
    if (!mirror)
        co_return std::unexpected(std::move(mirror.error()));
    if (mirror->memory.length != std::uint64_t{mirror_slots} * slot_bytes || !has(mirror->access, Access::remote_read))
        co_return std::unexpected(Error::protocol("kv", fmt::format("a mirror of {} bytes ({}), not {} readable",
                                                                    mirror->memory.length, to_string(mirror->access),
                                                                    std::uint64_t{mirror_slots} * slot_bytes)));
    auto slots = connection->alloc_local_mr(std::size_t{a->concurrent} * slot_bytes, Access::local_write);
    if (!slots)
        co_return std::unexpected(std::move(slots.error()));
    Result<Reader> reader(std::in_place, std::move(*connection), *mirror, std::move(*slots));
    co_return reader; // (g++ 12: no braced initializer in a coroutine's co_return)
}

asio::awaitable<void> generate(rpc::Endpoint* client, const Args* a, Load* load) {
    const auto executor = co_await asio::this_coro::executor;
    asio::steady_timer timer(executor);
    // the server may still be starting: a refused connection is tried again for 10 s
    auto session = co_await client->connect(a->host, a->port);
    for (int attempt = 0; !session && session.error().is_errno(ECONNREFUSED) && attempt < 100; ++attempt) {
        timer.expires_after(std::chrono::milliseconds(100));
        co_await timer.async_wait(asio::use_awaitable);
        session = co_await client->connect(a->host, a->port);
    }
    if (!session) {
        fmt::print(stderr, "kv: {}\n", session.error());
        ++load->failed;
        co_return;
    }
    std::optional<Reader> reader;
    if (a->read_gets) {
        auto made = co_await lend_me_the_mirror(executor, a);
        if (!made) {
            fmt::print(stderr, "kv: the table's mirror: {}\n", made.error());
            ++load->failed;
            co_return;
        }
        reader.emplace(std::move(*made));
    }
    const bool terminal = isatty(STDOUT_FILENO) != 0;
    const std::uint32_t window = session->info().window; // (all zero once the session has ended)
    load->workers_left = a->concurrent;
    for (std::uint32_t w = 0; w < a->concurrent; ++w) {
        const std::uint32_t share = a->ops / a->concurrent + (w < a->ops % a->concurrent ? 1 : 0);
        asio::co_spawn(executor, worker(&*session, reader ? &*reader : nullptr, a, share, w, load),
                       [load](std::exception_ptr e) {
                           if (e) { // counted, and the generator stops waiting for it
                               fmt::print(stderr, "kv: a worker ended by an exception\n");
                               ++load->failed;
                               --load->workers_left;
                           }
                       });
    }
    const auto start = Clock::now();
    while (load->workers_left > 0) {
        timer.expires_after(std::chrono::milliseconds(terminal ? 250 : 10));
        co_await timer.async_wait(asio::use_awaitable);
        if (terminal) {
            const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
            fmt::print("\rkv: {}/{} calls, {:.0f} calls/s", load->done, a->ops, static_cast<double>(load->done) / seconds);
            std::fflush(stdout);
        }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    auto& rt = load->round_trips_us;
    std::sort(rt.begin(), rt.end());
    const auto at = [&rt](double p) { return rt.empty() ? 0.0 : rt[std::min(rt.size() - 1, static_cast<std::size_t>(p * static_cast<double>(rt.size())))]; };
    const auto& counters = client->counters();
    fmt::print("{}kv: {} calls in {:.2f} s: {:.0f} calls/s, {} concurrent, window {}; round trip p50 {:.1f} us, "
               "p99 {:.1f} us\n"
               "kv: {} PUTs, {} GETs found and checked, {} missing, {} wrong, {} failed; {} retransmissions, {} "
               "packets dropped\n",
               terminal ? "\r\033[K" : "", load->done, seconds, static_cast<double>(load->done) / seconds,
               a->concurrent, window, at(0.5), at(0.99), load->puts, load->hits + load->read_hits,
               load->misses, load->wrong, load->failed, counters.retransmissions, counters.dropped());
    if (reader) {
        fmt::print("kv: {} GETs by one-sided READ, {} by RPC after a READ that could not answer\n", load->read_hits,
                   load->read_fallbacks);
        if (auto closed = co_await reader->connection.close(); !closed)
            fmt::print(stderr, "kv: closing the mirror's connection: {}\n", closed.error());
    }
    // every call has ended: the server hears the goodbye and ends its side first
    if (auto closed = co_await session->close(std::chrono::seconds(5)); !closed) {
        fmt::print(stderr, "kv: closing the session: {}\n", closed.error());
        ++load->failed;
    }
}

int generate_load(const Args& a) {
    asio::io_context io;
    const std::uint32_t window = a.window != 0 ? a.window : std::min(a.concurrent, server_window);
    auto client = rpc::Endpoint::create(io, {.device = a.device, .session_transport = a.transport,
                                             .ring = std::max(1024u, 2 * window),
                                             .window = window, .credits = std::max(16u, 2 * window),
                                             .drive = {.mode = a.mode}});
    if (!client) {
        fmt::print(stderr, "kv: {}\n", client.error());
        return 1;
    }
    Load load;
    // run(), stopped as the generator ends (see stop_when_served)
    asio::co_spawn(io, generate(client->get(), &a, &load), [&io, &load](std::exception_ptr e) {
        if (e) {
            fmt::print(stderr, "kv: the load generator ended by an exception\n");
            ++load.failed;
        }
        io.stop();
    });
    io.run();
    return load.wrong == 0 && load.failed == 0 && load.done == a.ops ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
    Args a;
    if (!parse(argc, argv, a))
        return usage();
    return a.serve ? serve(a) : generate_load(a);
}
