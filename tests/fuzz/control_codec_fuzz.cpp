// libFuzzer target: the connection's control-message decoder takes any bytes without
// reading outside them (ASan watches), and whatever it accepts encodes back to the
// same bytes.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "control_codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    namespace control = rdmaxx::detail::control;
    const std::span bytes(reinterpret_cast<const std::byte*>(data), size);
    const auto header = control::decode_header(bytes.first(std::min(size, control::header_bytes)), size);
    if (!header || header->kind == control::Kind::user)
        return 0;
    const auto message = control::decode(*header, bytes.subspan(control::header_bytes));
    if (message) {
        const auto again = control::encode(*message, header->credits);
        if (again.size != size || std::memcmp(again.bytes.data(), data, size) != 0)
            std::abort();
    }
    return 0;
}
