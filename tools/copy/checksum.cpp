#include "checksum.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace rdmaxx::copy {

struct Checksum::State {
    XXH64_state_t xxh;
};

Checksum::Checksum() : state_(std::make_unique<State>()) { XXH64_reset(&state_->xxh, 0); }
Checksum::~Checksum() = default;
Checksum::Checksum(Checksum&&) noexcept = default;
Checksum& Checksum::operator=(Checksum&&) noexcept = default;

void Checksum::update(std::span<const std::byte> bytes) noexcept {
    XXH64_update(&state_->xxh, bytes.data(), bytes.size());
}

std::uint64_t Checksum::digest() const noexcept { return XXH64_digest(&state_->xxh); }

std::uint64_t checksum_of(std::span<const std::byte> bytes) noexcept { return XXH64(bytes.data(), bytes.size(), 0); }

} // namespace rdmaxx::copy
