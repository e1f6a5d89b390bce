// libFuzzer target: the session setup messages' decoders take any bytes without
// reading outside them (ASan watches), and whatever they accept encodes back to the
// same bytes.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "session_codec.hpp"

namespace {

template <class Message>
void same_again(const Message& message, std::span<const std::byte> bytes) {
    const auto again = rdmaxx::rpc::detail::encode(message);
    if (!std::equal(again.begin(), again.end(), bytes.begin(), bytes.end()))
        std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    namespace rpc = rdmaxx::rpc::detail;
    const std::span bytes(reinterpret_cast<const std::byte*>(data), size);
    if (bytes.size() >= rpc::session_prefix_bytes) {
        (void)rpc::decode_request_prefix(bytes.first<rpc::session_prefix_bytes>());
        (void)rpc::decode_reply_prefix(bytes.first<rpc::session_prefix_bytes>());
    }
    if (const auto request = rpc::decode_request(bytes))
        same_again(*request, bytes);
    if (const auto reply = rpc::decode_reply(bytes)) {
        same_again(*reply, bytes);
        // what a client asking for the codec's maxima at MTU 4096 makes of it
        const rpc::SessionRequest asked{.client = {},
                                        .session = {},
                                        .limits = {.window = rpc::max_window,
                                                   .credits = rpc::max_credits,
                                                   .max_request = rpc::max_packets * 4064,
                                                   .max_response = rpc::max_packets * 4064,
                                                   .payload_per_packet = 4064}};
        if (!rpc::check_reply(asked, *reply))
            std::abort(); // a decoded reply is within those bounds
    }
    return 0;
}
