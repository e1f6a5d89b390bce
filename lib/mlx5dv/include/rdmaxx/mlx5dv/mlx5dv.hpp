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
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/pd.hpp>

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
    ibv_dm* get(std::source_location where = std::source_location::current()) const { return handle(where).get(); }
    const std::shared_ptr<ibv_dm>& handle(std::source_location where = std::source_location::current()) const {
        return rdmaxx::detail::live(dm_, "DeviceMemory", where);
    }

private:
    DeviceMemory(std::shared_ptr<ibv_dm> dm, std::size_t size) : dm_(std::move(dm)), size_(size) {}
    std::shared_ptr<ibv_dm> dm_; // keeps the device open
    std::size_t size_;
};

// Device memory registered as a memory region (ibv_reg_dm_mr, ibv_alloc_dm(3)). It is
// zero-based (IBV_ACCESS_ZERO_BASED, which ibv_reg_dm_mr requires): addresses in work
// requests are offsets into the device memory, not host pointers. There is therefore
// no LocalSlice (whose data() is a host pointer): a local scatter/gather entry comes
// from sge(), and a peer gets remote(), whose addr is 0 and slices like any other.
// IBV_SEND_INLINE cannot read device memory (mlx5dv_create_qp(3), NOTES).
class DeviceMemoryRegion : detail::MoveOnly {
public:
    // Registers all of `memory` in `pd` with `access` plus zero_based. A device that
    // cannot register device memory is an Error of kind unsupported.
    // Programming error: a moved-from PD or DeviceMemory, a PD of another device.
    static Result<DeviceMemoryRegion> register_memory(const ProtectionDomain& pd, const DeviceMemory& memory,
                                                      Access access,
                                                      std::source_location where = std::source_location::current());

    std::size_t size() const noexcept { return size_; }
    Access access() const noexcept { return access_; }
    // Programming error, here and below: a moved-from region.
    std::uint32_t lkey(std::source_location where = std::source_location::current()) const;
    std::uint32_t rkey(std::source_location where = std::source_location::current()) const;
    // Bytes [offset, offset + length) as a local scatter/gather entry.
    // Programming error (also): past the end, a length above 4 GiB - 1.
    ibv_sge sge(std::size_t offset, std::size_t length,
                std::source_location where = std::source_location::current()) const;
    // The descriptor to hand to a peer: {0, size, rkey}.
    RemoteMemory remote(std::source_location where = std::source_location::current()) const;
    ibv_mr* get(std::source_location where = std::source_location::current()) const {
        return rdmaxx::detail::live(mr_, "DeviceMemoryRegion", where).get();
    }

private:
    DeviceMemoryRegion(std::shared_ptr<ibv_mr> mr, std::size_t size, Access access)
        : mr_(std::move(mr)), size_(size), access_(access) {}
    std::shared_ptr<ibv_mr> mr_; // keeps the PD and the device memory alive
    std::size_t size_;
    Access access_;
};

} // namespace rdmaxx::mlx5
