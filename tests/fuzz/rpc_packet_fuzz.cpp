// libFuzzer target: the RPC packet header's decoder takes any bytes without reading
// outside them (ASan watches), and whatever it accepts encodes back to the same 32
// header bytes.
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "packet.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    namespace rpc = rdmaxx::rpc::detail;
    // MTU 256: small enough that a fuzzed message spans many packets, or goes whole
    static const rpc::PacketLimits limits(1 << 16, 256 - rpc::header_bytes, 1 << 16);
    const std::span bytes(reinterpret_cast<const std::byte*>(data), size);
    const auto header = rpc::decode(bytes, limits);
    if (header) {
        std::array<std::byte, rpc::header_bytes> again{};
        rpc::encode(*header, again);
        if (std::memcmp(again.data(), data, rpc::header_bytes) != 0)
            std::abort();
    }
    return 0;
}
