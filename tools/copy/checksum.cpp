#include "checksum.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace rdmaxx::copy {

struct Checksum::State {
    XXH3_state_t xxh;
};

Checksum::Checksum() : state_(std::make_unique<State>()) { XXH3_64bits_reset(&state_->xxh); }
Checksum::~Checksum() = default;
Checksum::Checksum(Checksum&&) noexcept = default;
Checksum& Checksum::operator=(Checksum&&) noexcept = default;

void Checksum::update(std::span<const std::byte> bytes) noexcept {
    XXH3_64bits_update(&state_->xxh, bytes.data(), bytes.size());
}

std::uint64_t Checksum::digest() const noexcept { return XXH3_64bits_digest(&state_->xxh); }

std::uint64_t checksum_of(std::span<const std::byte> bytes) noexcept { return XXH3_64bits(bytes.data(), bytes.size()); }

} // namespace rdmaxx::copy
