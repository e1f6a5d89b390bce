// libFuzzer target: endpoint_codec::decode takes any bytes without reading outside
// them (ASan watches), and whatever it accepts encodes back to the same message.
#include <cstdint>
#include <cstdlib>
#include <span>

#include <rdmaxx/ctrl/endpoint_codec.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    namespace codec = rdmaxx::endpoint_codec;
    const auto decoded = codec::decode(std::span(reinterpret_cast<const std::byte*>(data), size));
    if (decoded) {
        const auto again = codec::decode(codec::encode(*decoded));
        if (!again || *again != *decoded)
            std::abort();
    }
    return 0;
}
