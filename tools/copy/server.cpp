// The server: accepts clients on one io_context, one coroutine per client; each file
// goes into a temporary file beside its final name, renamed over it only when the
// client's checksum matches what was written.
#include <cstdlib>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <random>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <fmt/format.h>

#include <rdmaxx/async/blocking.hpp>

#include "channel.hpp"
#include "checksum.hpp"
#include "paths.hpp"
#include "run.hpp"

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them), as examples/kv notes.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace rdmaxx::copy {
namespace {

using namespace std::chrono_literals;

struct Server {
    Fd root;
    ConnectionOptions connection;
    bool once = false;
    std::uint32_t max_clients = 16;
    mode_t umask = 022;
    std::uint64_t clients = 0;
    std::size_t sessions = 0; // running now
    bool finished = false;    // --once: the client was served; or a signal
    bool failed = false;      // --once: its status
};

void log(std::uint64_t client, std::string_view what) {
    fmt::print(stderr, "rdmaxx-copy: client {}: {}\n", client, what);
    std::fflush(stderr);
}

// A temporary file in the destination's directory, removed unless committed.
class TempFile {
public:
    static Result<TempFile> create(Destination destination) {
        std::random_device random;
        for (int attempt = 0; attempt < 100; ++attempt) {
            const std::uint64_t r = (std::uint64_t{random()} << 32) | random();
            std::string name = temporary_name(destination.name, r);
            const int fd = ::openat(destination.directory.get(), name.c_str(),
                                    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
            if (fd >= 0)
                return TempFile(std::move(destination), std::move(name), Fd(fd));
            if (errno != EEXIST)
                return std::unexpected(Error::from_last_errno("openat", "a temporary file in '{}'", destination.shown));
        }
        return std::unexpected(Error::from_errno("openat", EEXIST, "no free temporary name"));
    }
    TempFile(TempFile&&) noexcept = default;
    TempFile& operator=(TempFile&&) = delete;
    ~TempFile() {
        if (fd_ && !committed_)
            ::unlinkat(destination_.directory.get(), name_.c_str(), 0);
    }
    int fd() const noexcept { return fd_.get(); }

    // Mode, data and name made durable: fchmod, fsync, rename over the final name,
    // fsync of the directory.
    Result<void> commit(mode_t mode) {
        if (::fchmod(fd_.get(), mode) != 0)
            return std::unexpected(Error::from_last_errno("fchmod", "'{}'", destination_.shown));
        if (::fsync(fd_.get()) != 0)
            return std::unexpected(Error::from_last_errno("fsync", "'{}'", destination_.shown));
        const int dir = destination_.directory.get();
        if (::renameat(dir, name_.c_str(), dir, destination_.name.c_str()) != 0)
            return std::unexpected(Error::from_last_errno("renameat", "'{}'", destination_.shown));
        committed_ = true;
        // the rename itself; a file system that cannot (EINVAL, EROFS) is not an error
        if (::fsync(dir) != 0 && errno != EINVAL && errno != EROFS)
            return std::unexpected(Error::from_last_errno(
                "fsync", "the directory of '{}' (the file is in place; its name may not survive a crash)",
                destination_.shown));
        return {};
    }
    const std::string& shown() const noexcept { return destination_.shown; }

private:
    TempFile(Destination destination, std::string name, Fd fd)
        : destination_(std::move(destination)), name_(std::move(name)), fd_(std::move(fd)) {}
    Destination destination_;
    std::string name_;
    Fd fd_;
    bool committed_ = false;
};

Result<void> pwrite_all(int fd, const std::byte* data, std::size_t length, std::uint64_t offset) {
    while (length > 0) {
        const ssize_t n = ::pwrite(fd, data, length, static_cast<off_t>(offset));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return std::unexpected(Error::from_last_errno("pwrite"));
        data += n;
        length -= static_cast<std::size_t>(n);
        offset += static_cast<std::uint64_t>(n);
    }
    return {};
}

bool closed_by_peer(const Error& e) { return e.is_errno(ECONNRESET); }

// What one session has: the client's shape and the staging region lent to it.
struct Session {
    Server* server = nullptr;
    std::uint64_t id = 0;
    Hello hello;
    const std::byte* staging = nullptr; // lent: valid while the lease runs and the connection lives
    Clock::time_point lease_end{};
    std::uint64_t stored = 0;
    std::uint64_t refused = 0;
    bool mid_file = false; // between file_ok and the file's verdict: its bytes are moving
};

// Where the file goes, opened as a temporary file; an Error refuses it.
Result<TempFile> prepare(const Session& s, const File& file, const Result<std::uint32_t>& chunks) {
    if (!chunks)
        return std::unexpected(chunks.error());
    auto destination =
        resolve(s.server->root.get(), file.target, file.name, (file.flags & file_into_directory) != 0);
    if (!destination)
        return std::unexpected(destination.error());
    return TempFile::create(std::move(*destination));
}

// One file, counted in s.stored or s.refused (the session goes on); an Error ends
// the session.
asio::awaitable<Result<void>> receive_file(async::Connection& c, Channel& channel, Session& s, File file) {
    const std::uint32_t block = s.hello.block;
    const auto chunks = chunk_count(file.size, block);
    Result<TempFile> temp = prepare(s, file, chunks);
    if (!temp) {
        const std::string why = describe(temp.error());
        log(s.id, fmt::format("refused '{}' -> '{}': {}", file.name, file.target, why));
        // a refusal's code is never 0 (the client would read success)
        FileResult refusal{.code = static_cast<std::uint32_t>(temp.error().code() != 0 ? temp.error().code() : EIO),
                           .text = why.substr(0, max_text)};
        const Message refused = std::move(refusal);
        if (auto ok = co_await channel.say(refused); !ok)
            co_return std::unexpected(ok.error());
        ++s.refused;
        co_return Result<void>{};
    }
    const Message go = FileOk{};
    if (auto ok = co_await channel.say(go); !ok)
        co_return std::unexpected(ok.error());
    s.mid_file = true;

    const auto started = Clock::now();
    const auto chunk_bound = bound_for(s.server->connection, block);
    // Cumulative acknowledgements every half window (at most 8 chunks): each carries
    // the credits of the receives the immediates used, so the client never runs dry.
    const std::uint32_t ack_every = std::clamp<std::uint32_t>(s.hello.depth / 2, 1, 8);
    Checksum checksum;
    for (std::uint32_t i = 0; i < *chunks; ++i) {
        const Timeout bound = chunk_bound;
        auto imm = co_await c.receive_write_imm(bound);
        if (!imm)
            co_return std::unexpected(imm.error());
        if (*imm != i)
            co_return std::unexpected(Error::protocol("rdmaxx-copy", fmt::format("chunk {} arrived where {} was due",
                                                                                 *imm, i)));
        if (Clock::now() >= s.lease_end) // the staging memory may no longer be ours to read
            co_return std::unexpected(Error::timeout("rdmaxx-copy", "the staging region's lease ran out"));
        const std::uint64_t offset = std::uint64_t{i} * block;
        const std::size_t length = static_cast<std::size_t>(std::min<std::uint64_t>(block, file.size - offset));
        const std::byte* slot = s.staging + std::size_t{i % s.hello.depth} * block;
        if (auto wrote = pwrite_all(temp->fd(), slot, length, offset); !wrote) {
            const SessionError failure{.code = static_cast<std::uint32_t>(wrote.error().code()),
                                       .text = fmt::format("writing '{}': {}", temp->shown(), wrote.error().message())
                                                   .substr(0, max_text)};
            const Message fatal = failure;
            (void)co_await channel.say(fatal);
            co_return std::unexpected(wrote.error());
        }
        checksum.update(std::span(slot, length));
        if ((i + 1) % ack_every == 0 || i + 1 == *chunks) {
            const Message ack = Ack{.through = i + 1};
            if (auto ok = co_await channel.say(ack); !ok)
                co_return std::unexpected(ok.error());
        }
    }
    auto done = co_await channel.hear(s.server->connection.timeout);
    if (!done)
        co_return std::unexpected(done.error());
    if (!std::holds_alternative<Done>(*done))
        co_return std::unexpected(unexpected_message("done", *done));
    const std::uint64_t theirs = std::get<Done>(*done).checksum;
    FileResult result;
    // the fsyncs may take long: on a helper thread, while the io_context serves the others
    auto commit = [&temp, mode = static_cast<mode_t>(file.mode & 0777 & ~s.server->umask)] {
        return temp->commit(mode);
    };
    if (theirs != checksum.digest()) {
        result = {.code = EBADMSG,
                  .text = fmt::format("checksum mismatch on '{}' (sent {:016x}, written {:016x}): not stored",
                                      temp->shown(), theirs, checksum.digest())
                              .substr(0, max_text)};
    } else if (auto committed = co_await async::run_blocking(commit, "rdmaxx-copy"); !committed) {
        result = {.code = static_cast<std::uint32_t>(committed.error().code() != 0 ? committed.error().code() : EIO),
                  .text = describe(committed.error()).substr(0, max_text)};
    } else {
        result = {.code = 0, .text = temp->shown()};
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    if (result.code == 0)
        log(s.id, fmt::format("stored '{}' ({} B, {:.3f} s, {:.1f} MiB/s)", result.text, file.size, seconds,
                              seconds > 0 ? static_cast<double>(file.size) / (1 << 20) / seconds : 0.0));
    else
        log(s.id, fmt::format("failed: {}", result.text));
    ++(result.code == 0 ? s.stored : s.refused);
    s.mid_file = false; // stored or removed: a client gone from here on lost nothing
    const Message verdict = std::move(result);
    if (auto ok = co_await channel.say(verdict); !ok)
        co_return std::unexpected(ok.error());
    co_return Result<void>{};
}

// The session's protocol; Ok when the client said goodbye.
asio::awaitable<Result<void>> run_session(async::Connection& c, Session& s) {
    auto opened = Channel::open(c);
    if (!opened)
        co_return std::unexpected(opened.error());
    Channel channel = std::move(*opened);
    const ConnectionOptions& options = s.server->connection;
    auto first = co_await channel.hear(options.timeout);
    if (!first)
        co_return std::unexpected(first.error());
    if (!std::holds_alternative<Hello>(*first))
        co_return std::unexpected(unexpected_message("hello", *first));
    s.hello = std::get<Hello>(*first);
    if (s.server->sessions > s.server->max_clients) { // counted, this one too, at its accept
        const SessionError busy{.code = EBUSY,
                                .text = fmt::format("the server serves {} clients at once, its most: try again later",
                                                    s.server->max_clients)};
        const Message refused = busy;
        (void)co_await channel.say(refused);
        co_return std::unexpected(Error::from_errno("rdmaxx-copy", EBUSY, busy.text));
    }
    if (auto fits = check_hello(s.hello); !fits) {
        const SessionError refusal{.code = EINVAL, .text = describe(fits.error()).substr(0, max_text)};
        const Message refused = refusal;
        (void)co_await channel.say(refused);
        co_return std::unexpected(fits.error());
    }
    // zeroed: a pooled block may hold an earlier session's bytes, which a chunk its
    // client did not write in full (the server cannot tell) would carry into a file
    const std::size_t staging_bytes = std::size_t{s.hello.block} * s.hello.depth;
    auto staging = c.alloc_local_mr(staging_bytes, Access::local_write | Access::remote_write);
    if (!staging)
        co_return std::unexpected(staging.error());
    // One lease for the session, as long as the connection's own bound for moving all
    // of the client's bytes (the client said how many), plus a timeout for each file's
    // exchanges and fsyncs (1,000 one-byte files took 3 s in the VM, past the bytes'
    // bound alone) and one for the session's own, at most max_lease.
    const std::uint64_t total_mib = std::min<std::uint64_t>(s.hello.total_bytes >> 20, 1ull << 30);
    const auto per_file = options.timeout * static_cast<std::int64_t>(std::uint64_t{s.hello.files} + 1);
    const auto lease = std::min(options.max_lease, bound_for(options, total_mib << 20) + per_file);
    s.staging = staging->data();
    s.lease_end = Clock::now() + lease;
    if (auto lent = co_await c.send_local_mr(std::move(*staging), lease); !lent)
        co_return std::unexpected(lent.error());
    const Message ready = Ready{};
    if (auto ok = co_await channel.say(ready); !ok)
        co_return std::unexpected(ok.error());
    for (;;) {
        auto next = co_await channel.hear(options.timeout);
        if (!next && closed_by_peer(next.error()))
            co_return Result<void>{}; // the client closed: done
        if (!next)
            co_return std::unexpected(next.error());
        if (!std::holds_alternative<File>(*next))
            co_return std::unexpected(unexpected_message("file", *next));
        auto file = co_await receive_file(c, channel, s, std::get<File>(std::move(*next)));
        // a client that closes once it has its last verdict may do so before our send
        // of it completed here (under loss its acknowledgement can come late): that is
        // the session's end, not a failure
        if (!file && !s.mid_file && closed_by_peer(file.error()))
            co_return Result<void>{};
        if (!file)
            co_return std::unexpected(file.error());
    }
}

asio::awaitable<void> session(async::Connection c, Server& server, std::uint64_t id) {
    Session s;
    s.server = &server;
    s.id = id;
    auto ended = co_await run_session(c, s);
    if (ended) {
        log(id, fmt::format("done: {} stored, {} failed", s.stored, s.refused));
        (void)co_await c.close();
    } else {
        log(id, fmt::format("dropped: {} ({} stored, {} failed)", ended.error(), s.stored, s.refused));
    }
    --server.sessions;
    if (server.once) {
        server.failed = !ended || s.refused > 0 || s.stored == 0;
        server.finished = true;
    }
}

asio::awaitable<void> accept_loop(asio::any_io_executor executor, async::Listener& listener, Server& server) {
    while (!server.finished) {
        auto c = co_await listener.accept(std::chrono::hours(1));
        if (!c) {
            if (c.error().is_timeout())
                continue;
            fmt::print(stderr, "rdmaxx-copy: accept: {}\n", c.error());
            server.failed = true;
            server.finished = true;
            co_return;
        }
        ++server.sessions;
        const std::uint64_t id = ++server.clients;
        asio::co_spawn(executor, session(std::move(*c), server, id), asio::detached);
        if (server.once)
            co_return;
    }
}

} // namespace

int serve(const Options& o) {
    Server server;
    const int root = ::open(o.serve->c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) {
        fmt::print(stderr, "rdmaxx-copy: --serve {}: {}\n", *o.serve, std::strerror(errno));
        return 1;
    }
    server.root = Fd(root);
    server.once = o.once;
    server.max_clients = o.max_clients;
    server.umask = ::umask(022);
    ::umask(server.umask);
    server.connection.transport = o.rdma_cm ? Transport::rdma_cm : Transport::tcp;
    server.connection.device = o.device;
    server.connection.gid_index = o.gid_index;
    server.connection.timeout = o.timeout;
    server.connection.max_lease = std::chrono::hours(24);
    server.connection.receive_depth = receive_depth;

    asio::io_context io;
    auto listener = async::Listener::listen(io.get_executor(), o.bind, o.port, server.connection);
    if (!listener) {
        fmt::print(stderr, "rdmaxx-copy: listening on {}:{}: {}\n", o.bind, o.port, listener.error());
        return 1;
    }
    fmt::print("rdmaxx-copy: serving {} on {}:{} ({}){}\n", *o.serve, o.bind, listener->port(),
               o.rdma_cm ? "RDMA CM" : "TCP", o.once ? ", one client" : "");
    std::fflush(stdout);
    // SIGINT / SIGTERM end the loop; the sessions' coroutines are destroyed with the
    // io_context, and their temporary files with them.
    asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&server](const asio::error_code& ec, int) {
        if (!ec)
            server.finished = true;
    });
    asio::co_spawn(io, accept_loop(io.get_executor(), *listener, server), asio::detached);
    while (!server.finished)
        io.run_one();
    return server.failed ? 1 : 0;
}

} // namespace rdmaxx::copy
