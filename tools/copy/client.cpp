// The client: one connection, the files one after another, each file's blocks
// pipelined: read into a local staging slot, RDMA WRITE with an immediate (the chunk
// index) into the server's slot of the same number, several in flight. A local slot
// is reused once its own WRITE completed; a server slot once the server acknowledged
// the chunk that used it.
#include <cstdlib>

#include <cerrno>
#include <cstring>
#include <memory>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "channel.hpp"
#include "checksum.hpp"
#include "paths.hpp"
#include "report.hpp"
#include "run.hpp"

// g++ 12 sees Asio's coroutine-frame operator delete as mismatched with its operator
// new once it inlines both into a coroutine (a false positive: the frame's allocator
// pairs them), as examples/kv notes.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace rdmaxx::copy {
namespace {

// The WRITEs of one file in flight, shared with their coroutines.
struct Pipeline {
    explicit Pipeline(asio::any_io_executor executor, async::Connection& c, std::uint32_t depth)
        : connection(&c), busy(depth, false), wake(executor) {}
    async::Connection* connection;
    std::vector<bool> busy; // per local slot: its WRITE is in flight
    std::size_t in_flight = 0;
    std::optional<Error> failed;
    asio::steady_timer wake; // cancelled when a WRITE completes: the waiting side looks again
};

asio::awaitable<void> write_chunk(std::shared_ptr<Pipeline> p, LocalSlice local, RemoteMemory remote,
                                  std::uint32_t chunk, std::uint32_t slot) {
    auto done = co_await p->connection->write_with_imm(local, remote, chunk);
    if (!done && !p->failed)
        p->failed = done.error();
    p->busy[slot] = false;
    --p->in_flight;
    p->wake.cancel();
}

asio::awaitable<void> wait_for_wake(Pipeline& p) {
    p.wake.expires_at(asio::steady_timer::time_point::max());
    asio::error_code ignored;
    co_await p.wake.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
}

// Every WRITE of the pipeline completed (successfully or not): its memory is free.
asio::awaitable<void> drain(Pipeline& p) {
    while (p.in_flight > 0)
        co_await wait_for_wake(p);
}

Result<void> pread_all(int fd, std::byte* data, std::size_t length, std::uint64_t offset) {
    while (length > 0) {
        const ssize_t n = ::pread(fd, data, length, static_cast<off_t>(offset));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return std::unexpected(Error::from_last_errno("pread"));
        if (n == 0)
            return std::unexpected(Error::from_errno("pread", EIO, "the file shrank while it was sent"));
        data += n;
        length -= static_cast<std::size_t>(n);
        offset += static_cast<std::uint64_t>(n);
    }
    return {};
}

// A file to send, as listed before the session (its descriptor is not kept: a copy of
// more files than the descriptor limit must not run out).
struct Local {
    std::string path;
    std::uint64_t size = 0;
    std::uint32_t mode = 0;
    std::optional<Error> error; // could not be opened: not sent
};

Local open_local(const std::string& path) {
    Local l;
    l.path = path;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        l.error = Error::from_last_errno("open", "'{}'", path);
        return l;
    }
    const Fd listed(fd);
    struct stat st{};
    if (::fstat(fd, &st) != 0) {
        l.error = Error::from_last_errno("fstat", "'{}'", path);
    } else if (!S_ISREG(st.st_mode)) {
        l.error = Error::from_errno("rdmaxx-copy", EINVAL, fmt::format("'{}' is not a regular file", path));
    } else {
        l.size = static_cast<std::uint64_t>(st.st_size);
        l.mode = st.st_mode & 07777;
    }
    return l;
}

std::string base_name(const std::string& path) {
    std::string_view p = path;
    while (p.size() > 1 && p.back() == '/')
        p.remove_suffix(1);
    const auto slash = p.rfind('/');
    return std::string(slash == std::string_view::npos ? p : p.substr(slash + 1));
}

struct Client {
    const Options* options = nullptr;
    ConnectionOptions connection;
    Progress progress{false};
    std::vector<FileReport> reports;
    bool done = false;
};

struct Shared {
    async::Connection* c = nullptr;
    Channel* channel = nullptr;
    RemoteMr remote;
    MemoryRegion* staging = nullptr;
};

// One file; an Error ends the session (the report is filled either way).
asio::awaitable<Result<void>> send_one(asio::any_io_executor executor, Client& client, Shared& sh, Local& file,
                                       FileReport& report) {
    const Options& o = *client.options;
    const auto started = Clock::now();
    const auto finish = [&report, started](bool ok, std::string text) {
        report.ok = ok;
        (ok ? report.stored_as : report.error) = std::move(text);
        report.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    };
    report.bytes = file.size;
    // opened again at its turn, and sent only as it was listed (the hello counted it)
    const Fd fd(::open(file.path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st{};
    if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0) {
        finish(false, describe(Error::from_last_errno("open", "'{}'", file.path)));
        co_return Result<void>{};
    }
    if (static_cast<std::uint64_t>(st.st_size) != file.size) {
        finish(false, fmt::format("'{}' changed size since the copy began ({} B, now {} B): not sent", file.path,
                                  file.size, st.st_size));
        co_return Result<void>{};
    }
    const auto chunks = chunk_count(file.size, o.block);
    if (!chunks) {
        finish(false, describe(chunks.error()));
        co_return Result<void>{};
    }
    File announce{.size = file.size,
                  .mode = file.mode,
                  .flags = static_cast<std::uint8_t>(o.files.size() > 1 ? file_into_directory : 0),
                  .target = o.target,
                  .name = base_name(file.path).substr(0, max_name)};
    const Message file_message = std::move(announce);
    if (auto ok = co_await sh.channel->say(file_message); !ok) {
        finish(false, describe(ok.error()));
        co_return std::unexpected(ok.error());
    }
    auto answer = co_await sh.channel->hear(client.connection.timeout);
    if (!answer) {
        finish(false, describe(answer.error()));
        co_return std::unexpected(answer.error());
    }
    if (const auto* refused = std::get_if<FileResult>(&*answer); refused && refused->code != 0) {
        finish(false, fmt::format("refused by the server: {}", refused->text));
        co_return Result<void>{};
    }
    if (!std::holds_alternative<FileOk>(*answer)) {
        auto e = unexpected_message("file_ok", *answer);
        finish(false, describe(e));
        co_return std::unexpected(std::move(e));
    }

    client.progress.start(file.path, file.size);
    const auto chunk_bound = bound_for(client.connection, o.block);
    auto pipeline = std::make_shared<Pipeline>(executor, *sh.c, o.depth);
    Checksum checksum;
    std::uint32_t acked = 0;
    std::optional<Error> failed;
    for (std::uint32_t i = 0; i < *chunks && !failed; ++i) {
        // the server's slot: free once the chunk that used it was acknowledged
        while (i - acked >= o.depth && !failed) {
            auto heard = co_await sh.channel->hear(chunk_bound);
            if (!heard)
                failed = heard.error();
            else if (const auto* ack = std::get_if<Ack>(&*heard); ack && ack->through > acked && ack->through <= i)
                acked = ack->through;
            else
                failed = unexpected_message("an acknowledgement of a chunk sent", *heard);
            client.progress.advance(std::min<std::uint64_t>(file.size, std::uint64_t{acked} * o.block));
        }
        // our slot: free once its own WRITE completed
        const std::uint32_t slot = i % o.depth;
        while (!failed && pipeline->busy[slot] && !pipeline->failed)
            co_await wait_for_wake(*pipeline);
        if (pipeline->failed)
            failed = pipeline->failed;
        if (failed)
            break;
        const std::uint64_t offset = std::uint64_t{i} * o.block;
        const std::size_t length = static_cast<std::size_t>(std::min<std::uint64_t>(o.block, file.size - offset));
        const std::size_t at = std::size_t{slot} * o.block;
        if (auto read = pread_all(fd.get(), sh.staging->data() + at, length, offset); !read) {
            failed = Error::from_errno("rdmaxx-copy", read.error().code(),
                                       fmt::format("reading '{}': {}", file.path, describe(read.error())));
            break;
        }
        checksum.update(std::span<const std::byte>(sh.staging->data() + at, length));
        pipeline->busy[slot] = true;
        ++pipeline->in_flight;
        asio::co_spawn(executor, write_chunk(pipeline, sh.staging->slice(at, length), sh.remote.slice(at, length), i, slot),
                       asio::detached);
    }
    co_await drain(*pipeline);
    if (!failed && pipeline->failed)
        failed = pipeline->failed;
    if (failed) {
        client.progress.finish();
        finish(false, describe(*failed));
        co_return std::unexpected(*failed);
    }
    const Message done = Done{.checksum = checksum.digest()};
    if (auto ok = co_await sh.channel->say(done); !ok) {
        client.progress.finish();
        finish(false, describe(ok.error()));
        co_return std::unexpected(ok.error());
    }
    for (;;) { // the last acknowledgements, then the result
        auto heard = co_await sh.channel->hear(chunk_bound);
        if (!heard) {
            client.progress.finish();
            finish(false, describe(heard.error()));
            co_return std::unexpected(heard.error());
        }
        if (const auto* ack = std::get_if<Ack>(&*heard); ack && ack->through > acked && ack->through <= *chunks) {
            acked = ack->through;
            client.progress.advance(std::min<std::uint64_t>(file.size, std::uint64_t{acked} * o.block));
            continue;
        }
        client.progress.finish();
        if (const auto* result = std::get_if<FileResult>(&*heard)) {
            if (result->code == 0 && acked == *chunks)
                finish(true, result->text);
            else if (result->code == 0)
                finish(false, "the server stored the file before acknowledging every chunk");
            else
                finish(false, result->text);
            co_return Result<void>{};
        }
        auto e = unexpected_message("a result", *heard);
        finish(false, describe(e));
        co_return std::unexpected(std::move(e));
    }
}

void print_report(const Client& client, const FileReport& r) {
    if (client.options->json)
        fmt::print("{}\n", json_line(r));
    else if (r.ok)
        fmt::print("{}\n", summary_line(r));
    if (!r.ok)
        fmt::print(stderr, "rdmaxx-copy: {}: {}\n", r.file, r.error);
    std::fflush(stdout);
    std::fflush(stderr);
}

// The session: hello, the staging region lent, the files one after another.
asio::awaitable<Result<void>> run_session(asio::any_io_executor ex, Client& cl, async::Connection& conn,
                                          std::vector<Local>& fs, std::uint64_t bytes, std::uint32_t count) {
    const Options& op = *cl.options;
    auto opened = Channel::open(conn);
    if (!opened)
        co_return std::unexpected(opened.error());
    Channel channel = std::move(*opened);
    const Message hello = Hello{.block = op.block, .depth = op.depth, .files = count, .total_bytes = bytes};
    if (auto ok = co_await channel.say(hello); !ok)
        co_return std::unexpected(ok.error());
    auto ready = co_await channel.hear(cl.connection.timeout);
    if (!ready)
        co_return std::unexpected(ready.error());
    if (!std::holds_alternative<Ready>(*ready))
        co_return std::unexpected(unexpected_message("ready", *ready));
    auto remote = co_await conn.receive_remote_mr(cl.connection.timeout);
    if (!remote)
        co_return std::unexpected(remote.error());
    const std::uint64_t staging_bytes = std::uint64_t{op.block} * op.depth;
    if (remote->memory.length < staging_bytes)
        co_return std::unexpected(Error::protocol(
            "rdmaxx-copy", fmt::format("the server lent {} B of staging, {} B are needed",
                                       remote->memory.length, staging_bytes)));
    const AllocateOptions uninitialised{.zeroed = false};
    auto staging = conn.alloc_local_mr(staging_bytes, Access::local_write, uninitialised);
    if (!staging)
        co_return std::unexpected(staging.error());
    Shared sh{.c = &conn, .channel = &channel, .remote = *remote, .staging = &*staging};
    for (std::size_t i = 0; i < fs.size(); ++i) {
        if (fs[i].error)
            continue;
        auto sent = co_await send_one(ex, cl, sh, fs[i], cl.reports[i]);
        print_report(cl, cl.reports[i]);
        if (!sent) {
            for (std::size_t j = i + 1; j < fs.size(); ++j)
                if (!fs[j].error) {
                    cl.reports[j].error = fmt::format("not sent: {}", describe(sent.error()));
                    print_report(cl, cl.reports[j]);
                }
            co_return std::unexpected(sent.error());
        }
    }
    co_return Result<void>{};
}

asio::awaitable<void> run_client(asio::any_io_executor executor, Client& client) {
    const Options& o = *client.options;
    std::vector<Local> files;
    std::uint64_t total = 0;
    std::uint32_t sendable = 0;
    for (const auto& path : o.files) {
        files.push_back(open_local(path));
        if (!files.back().error) {
            total += files.back().size;
            ++sendable;
        }
    }
    client.reports.resize(files.size());
    for (std::size_t i = 0; i < files.size(); ++i) {
        client.reports[i].file = files[i].path;
        if (files[i].error) {
            client.reports[i].error = describe(*files[i].error);
            print_report(client, client.reports[i]);
        }
    }
    std::optional<Error> fatal;
    if (sendable > 0) {
        const ConnectionOptions connect_options = client.connection;
        auto c = co_await async::Connection::connect(executor, o.host, o.port, connect_options);
        if (!c) {
            fatal = c.error();
        } else {
            auto session = co_await run_session(executor, client, *c, files, total, sendable);
            if (session)
                (void)co_await c->close();
            else
                fatal = session.error();
        }
    }
    if (fatal && sendable > 0) {
        for (std::size_t i = 0; i < files.size(); ++i)
            if (!files[i].error && client.reports[i].error.empty() && !client.reports[i].ok) {
                client.reports[i].error = describe(*fatal);
                print_report(client, client.reports[i]);
            }
        fmt::print(stderr, "rdmaxx-copy: {}\n", *fatal);
    }
    client.done = true;
}

} // namespace

int send_files(const Options& o) {
    Client client;
    client.options = &o;
    client.progress = Progress(::isatty(STDERR_FILENO) == 1);
    client.connection.transport = o.rdma_cm ? Transport::rdma_cm : Transport::tcp;
    client.connection.device = o.device;
    client.connection.gid_index = o.gid_index;
    client.connection.timeout = o.timeout;
    client.connection.receive_depth = receive_depth;
    const auto started = Clock::now();
    asio::io_context io;
    asio::co_spawn(io, run_client(io.get_executor(), client), asio::detached);
    while (!client.done)
        io.run_one();
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    std::uint64_t ok = 0, bytes = 0;
    for (const auto& r : client.reports)
        if (r.ok) {
            ++ok;
            bytes += r.bytes;
        }
    if (o.json) {
        fmt::print("{}\n", json_total(client.reports.size(), ok, bytes, seconds));
        std::fflush(stdout);
    }
    return ok == client.reports.size() ? 0 : 1;
}

} // namespace rdmaxx::copy
