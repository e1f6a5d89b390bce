// libFuzzer target: the RC path's decoders (rc_codec.hpp) take any bytes without reading
// outside them (ASan watches), and whatever they accept is within the limits they were
// given and encodes back to the same bytes: the setup messages from a session's control
// connection, the request descriptor a server finds in a request with the rdma flag (or
// SENT whole), a response descriptor, and a WRITE's immediate.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "rc_codec.hpp"

namespace {

void same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
    if (!std::ranges::equal(a, b))
        std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    namespace rpc = rdmaxx::rpc::detail;
    const std::span bytes(reinterpret_cast<const std::byte*>(data), size);

    if (bytes.size() >= rpc::rc_prefix_bytes) {
        const auto length = rpc::decode_rc_prefix(bytes.first<rpc::rc_prefix_bytes>());
        if (length && *length != rpc::rc_message_bytes)
            std::abort(); // the reader reads this many: never more than a message
    }
    if (const auto message = rpc::decode_rc(bytes))
        same_bytes(rpc::encode(*message), bytes);

    // a session's limits as a server holds them (a 64 KiB request, 1 MiB response)
    constexpr std::uint32_t max_request = 1 << 16, max_response = 1 << 20;
    if (const auto descriptor = rpc::decode_request_descriptor(bytes, max_request, max_response)) {
        if (descriptor->request.length > max_request || descriptor->response.length > max_response ||
            descriptor->inline_request.size() > max_request)
            std::abort();
        if (descriptor->request.length != 0 && !descriptor->inline_request.empty())
            std::abort();
        // the inline request is the bytes after the head, wholly inside the message
        if (descriptor->inline_request.data() != bytes.data() + rpc::request_descriptor_bytes ||
            descriptor->inline_request.size() != bytes.size() - rpc::request_descriptor_bytes)
            std::abort();
        same_bytes(rpc::encode_request_head(descriptor->request, descriptor->response),
                   bytes.first(rpc::request_descriptor_bytes));
    }

    if (const auto announced = rpc::decode_response_descriptor(bytes))
        same_bytes(rpc::encode_response_descriptor(*announced), bytes);

    // every immediate decodes to a call's name whose fields fit their bits
    if (bytes.size() >= 4) {
        const auto imm = static_cast<std::uint32_t>(data[0]) << 24 | static_cast<std::uint32_t>(data[1]) << 16 |
                         static_cast<std::uint32_t>(data[2]) << 8 | data[3];
        if (rpc::encode_written(rpc::decode_written(imm)) != imm)
            std::abort();
    }
    return 0;
}
