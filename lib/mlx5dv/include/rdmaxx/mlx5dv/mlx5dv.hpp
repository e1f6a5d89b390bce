// Mellanox/NVIDIA mlx5 direct-verbs extras. The same declarations in every build and
// on every machine: a build without mlx5dv, or a device that is not an mlx5 device,
// answers every call with an Error of kind unsupported, never an abort or a link error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <source_location>
#include <span>
#include <string_view>

#include <infiniband/verbs.h>

#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::mlx5 {

// Whether this build found infiniband/mlx5dv.h and libmlx5 (option mlx5dv).
bool built_with_mlx5dv() noexcept;

// Whether the device named `device` is driven by the mlx5 provider. An unknown name
// is an Error (ENODEV); so is a build without mlx5dv.
Result<bool> is_supported(std::string_view device);

struct OpenOptions {
    bool devx = false; // MLX5DV_CONTEXT_FLAGS_DEVX
};

// Opens `device` through mlx5dv_open_device; a non-mlx5 device is an Error.
Result<Context> open(std::string_view device, OpenOptions options = {});

// What mlx5dv_query_device reports, typed.
struct DeviceCaps {
    std::uint8_t version = 0;
    std::uint64_t flags = 0;          // enum mlx5dv_context_flags, all of them
    bool cqe_v1 = false;
    bool mpw_allowed = false;
    bool enhanced_mpw = false;
    bool cqe_128b_compression = false;
    bool cqe_128b_padding = false;
    std::uint32_t cqe_compression_max = 0;     // 0: no CQE compression
    std::uint32_t cqe_compression_formats = 0; // enum mlx5dv_cqe_comp_res_format
    std::uint32_t dc_odp_caps = 0;             // enum ibv_odp_transport_cap_bits
    std::uint32_t tunnel_offloads = 0;
    std::uint8_t lag_ports = 0;
    std::size_t max_wr_memcpy_length = 0;
};

// Programming error: a moved-from Context. A non-mlx5 device is an Error.
Result<DeviceCaps> query(const Context& context, std::source_location where = std::source_location::current());

// On-device memory (ibv_alloc_dm(3)), read and written with copies. A device without
// device memory (rxe, most non-mlx5 devices) is an Error of kind unsupported.
class DeviceMemory : detail::MoveOnly {
public:
    // Programming error: a moved-from Context, size 0.
    static Result<DeviceMemory> allocate(const Context& context, std::size_t size,
                                         std::source_location where = std::source_location::current());

    std::size_t size() const noexcept { return size_; }
    // Programming error, both: offset + bytes past the end.
    Result<void> copy_to(std::size_t offset, std::span<const std::byte> bytes,
                         std::source_location where = std::source_location::current());
    Result<void> copy_from(std::size_t offset, std::span<std::byte> bytes,
                           std::source_location where = std::source_location::current()) const;
    ibv_dm* get(std::source_location where = std::source_location::current()) const;

private:
    DeviceMemory(std::shared_ptr<ibv_dm> dm, std::size_t size) : dm_(std::move(dm)), size_(size) {}
    std::shared_ptr<ibv_dm> dm_; // keeps the device open
    std::size_t size_;
};

} // namespace rdmaxx::mlx5
