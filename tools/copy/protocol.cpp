#include "protocol.hpp"

#include <cerrno>

#include <fmt/format.h>

#include <rdmaxx/wrap/wire.hpp>

namespace rdmaxx::copy {
namespace {

Error malformed(std::string detail) { return Error::protocol("rdmaxx-copy", std::move(detail)); }

// Appends big-endian integers and byte strings.
class Writer {
public:
    explicit Writer(std::vector<std::byte>& out) : out_(out) { out_.clear(); }
    void put(std::uint64_t value, int bytes) {
        const std::size_t at = out_.size();
        out_.resize(at + static_cast<std::size_t>(bytes));
        wire::put(out_.data() + at, value, bytes);
    }
    void put(std::string_view text) {
        const auto* p = reinterpret_cast<const std::byte*>(text.data());
        out_.insert(out_.end(), p, p + text.size());
    }

private:
    std::vector<std::byte>& out_;
};

// Reads what Writer wrote, never past the end: a short read sets a flag.
class Reader {
public:
    explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
    std::uint64_t get(int bytes) {
        if (short_ || bytes_.size() - at_ < static_cast<std::size_t>(bytes)) {
            short_ = true;
            return 0;
        }
        const std::uint64_t value = wire::get(bytes_.data() + at_, bytes);
        at_ += static_cast<std::size_t>(bytes);
        return value;
    }
    std::string text(std::size_t length) {
        if (short_ || bytes_.size() - at_ < length) {
            short_ = true;
            return {};
        }
        std::string s(reinterpret_cast<const char*>(bytes_.data() + at_), length);
        at_ += length;
        return s;
    }
    // Every byte read, none missing, none left over.
    bool exact() const noexcept { return !short_ && at_ == bytes_.size(); }

private:
    std::span<const std::byte> bytes_;
    std::size_t at_ = 0;
    bool short_ = false;
};

// A result's or an error's body: code u32, text_len u16, text.
void put_status(Writer& w, std::uint32_t code, const std::string& text, std::source_location where) {
    require(text.size() <= max_text, where, "rdmaxx-copy: a text of {} B (at most {})", text.size(), max_text);
    w.put(code, 4);
    w.put(text.size(), 2);
    w.put(text);
}

Type type_of(const Message& m) { return static_cast<Type>(m.index() + 1); }

template <class T>
Result<Message> finish(const Reader& r, Type type, T value) {
    if (!r.exact())
        return std::unexpected(malformed(fmt::format("a {} message of the wrong size", type_name(type))));
    return Message{std::move(value)};
}

} // namespace

std::string_view type_name(Type type) noexcept {
    switch (type) {
    case Type::hello: return "hello";
    case Type::ready: return "ready";
    case Type::file: return "file";
    case Type::file_ok: return "file_ok";
    case Type::ack: return "ack";
    case Type::done: return "done";
    case Type::result: return "result";
    case Type::error: return "error";
    }
    return "unknown";
}

void encode(const Message& message, std::vector<std::byte>& out, std::source_location where) {
    Writer w(out);
    w.put(magic, 4);
    w.put(version, 1);
    w.put(static_cast<std::uint8_t>(type_of(message)), 1);
    w.put(0, 2);
    if (const auto* h = std::get_if<Hello>(&message)) {
        w.put(h->block, 4);
        w.put(h->depth, 4);
        w.put(h->files, 4);
        w.put(h->total_bytes, 8);
    } else if (const auto* f = std::get_if<File>(&message)) {
        require(f->target.size() <= max_target && f->name.size() <= max_name, where,
                "rdmaxx-copy: a file message's target ({} B, at most {}) or name ({} B, at most {}) is too long",
                f->target.size(), max_target, f->name.size(), max_name);
        w.put(f->size, 8);
        w.put(f->mode, 4);
        w.put(f->flags, 1);
        w.put(f->target.size(), 2);
        w.put(f->name.size(), 2);
        w.put(f->target);
        w.put(f->name);
    } else if (const auto* a = std::get_if<Ack>(&message)) {
        w.put(a->through, 4);
    } else if (const auto* d = std::get_if<Done>(&message)) {
        w.put(d->checksum, 8);
    } else if (const auto* r = std::get_if<FileResult>(&message)) {
        put_status(w, r->code, r->text, where);
    } else if (const auto* e = std::get_if<SessionError>(&message)) {
        put_status(w, e->code, e->text, where);
    }
}

Result<Message> decode(std::span<const std::byte> bytes) {
    if (bytes.size() > max_message)
        return std::unexpected(malformed(fmt::format("a message of {} B (at most {})", bytes.size(), max_message)));
    Reader r(bytes);
    const auto got_magic = r.get(4);
    const auto got_version = r.get(1);
    const auto got_type = r.get(1);
    const auto zero = r.get(2);
    if (bytes.size() < header_bytes)
        return std::unexpected(malformed(fmt::format("a message of {} B, shorter than a header", bytes.size())));
    if (got_magic != magic)
        return std::unexpected(malformed(fmt::format("not an rdmaxx-copy message (magic {:#010x})", got_magic)));
    if (got_version != version)
        return std::unexpected(malformed(fmt::format("protocol version {} (this side speaks {})", got_version, version)));
    if (zero != 0)
        return std::unexpected(malformed("a header's reserved bytes are not zero"));
    const auto type = static_cast<Type>(got_type);
    switch (type) {
    case Type::hello: {
        Hello h;
        h.block = static_cast<std::uint32_t>(r.get(4));
        h.depth = static_cast<std::uint32_t>(r.get(4));
        h.files = static_cast<std::uint32_t>(r.get(4));
        h.total_bytes = r.get(8);
        return finish(r, type, h);
    }
    case Type::ready: return finish(r, type, Ready{});
    case Type::file: {
        File f;
        f.size = r.get(8);
        f.mode = static_cast<std::uint32_t>(r.get(4));
        f.flags = static_cast<std::uint8_t>(r.get(1));
        const auto target_len = r.get(2);
        const auto name_len = r.get(2);
        if (target_len > max_target || name_len > max_name)
            return std::unexpected(malformed(fmt::format("a file message's target ({} B) or name ({} B) is too long",
                                                         target_len, name_len)));
        if ((f.flags & ~file_into_directory) != 0)
            return std::unexpected(malformed(fmt::format("a file message with unknown flags {:#x}", f.flags)));
        f.target = r.text(target_len);
        f.name = r.text(name_len);
        return finish(r, type, std::move(f));
    }
    case Type::file_ok: return finish(r, type, FileOk{});
    case Type::ack: return finish(r, type, Ack{.through = static_cast<std::uint32_t>(r.get(4))});
    case Type::done: return finish(r, type, Done{.checksum = r.get(8)});
    case Type::result:
    case Type::error: {
        const auto code = static_cast<std::uint32_t>(r.get(4));
        const auto length = r.get(2);
        if (length > max_text)
            return std::unexpected(malformed(fmt::format("a {} text of {} B (at most {})", type_name(type), length,
                                                         max_text)));
        std::string text = r.text(length);
        if (type == Type::result)
            return finish(r, type, FileResult{.code = code, .text = std::move(text)});
        if (code == 0)
            return std::unexpected(malformed("an error message with code 0"));
        return finish(r, type, SessionError{.code = code, .text = std::move(text)});
    }
    }
    return std::unexpected(malformed(fmt::format("unknown message type {}", got_type)));
}

Result<void> check_hello(const Hello& h) {
    const auto refuse = [](std::string why) -> Result<void> {
        return std::unexpected(Error::from_errno("rdmaxx-copy", EINVAL, std::move(why)));
    };
    if (h.block < min_block || h.block > max_block)
        return refuse(fmt::format("block {} B outside {}..{}", h.block, min_block, max_block));
    if (h.depth < 1 || h.depth > max_depth)
        return refuse(fmt::format("depth {} outside 1..{}", h.depth, max_depth));
    if (std::uint64_t{h.block} * h.depth > max_staging)
        return refuse(fmt::format("block x depth = {} B (at most {} B of staging)", std::uint64_t{h.block} * h.depth,
                                  max_staging));
    if (h.files < 1 || h.files > max_files)
        return refuse(fmt::format("{} files (1..{})", h.files, max_files));
    return {};
}

Result<std::uint32_t> chunk_count(std::uint64_t size, std::uint32_t block) {
    const std::uint64_t chunks = size / block + (size % block != 0);
    if (chunks > 0xffffffffu)
        return std::unexpected(Error::from_errno("rdmaxx-copy", EFBIG,
                                                 fmt::format("{} B in blocks of {} B: more than 2^32 - 1 chunks", size,
                                                             block)));
    return static_cast<std::uint32_t>(chunks);
}

} // namespace rdmaxx::copy
