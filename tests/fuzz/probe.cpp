// Configure-time probe: can this clang build a libFuzzer target against libstdc++'s
// <expected>?
#include <cstddef>
#include <cstdint>
#include <expected>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t size) {
    const std::expected<std::size_t, int> r = size;
    return r ? 0 : 1;
}
