/// @file
/// Mellanox/NVIDIA mlx5 direct-verbs extras. The same declarations in every build and
/// on every machine, never an abort or a link error: a build without mlx5dv answers
/// every mlx5dv call with an Error of kind unsupported, and so does a device that is
/// not an mlx5 device (but is_supported(), which says false). DeviceMemory is plain
/// verbs (ibv_alloc_dm): it works in any build, on any device that has device memory,
/// and is unsupported elsewhere.
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

/// Whether this build found infiniband/mlx5dv.h and libmlx5 (option mlx5dv).
bool built_with_mlx5dv() noexcept;

/// Whether the device named `device` is driven by the mlx5 provider.
/// @errors An unknown name (ENODEV), ibv_get_device_list's failure; a build without
/// mlx5dv (unsupported).
Result<bool> is_supported(std::string_view device);

/// How open() opens a device.
struct OpenOptions {
    bool devx = false; ///< MLX5DV_CONTEXT_FLAGS_DEVX
};

/// Opens `device` through mlx5dv_open_device; a non-mlx5 device is an Error.
/// @errors An unknown name (ENODEV); a device that is not an mlx5 device, or a build
/// without mlx5dv (unsupported); mlx5dv_open_device's failure (its errno).
Result<Context> open(std::string_view device, OpenOptions options = {});

/// What mlx5dv_query_device reports, typed.
struct DeviceCaps {
    std::uint8_t version = 0;         ///< mlx5dv_context::version
    std::uint64_t flags = 0;          ///< enum mlx5dv_context_flags, all of them
    bool cqe_v1 = false;              ///< MLX5DV_CONTEXT_FLAGS_CQE_V1
    bool mpw_allowed = false;         ///< MLX5DV_CONTEXT_FLAGS_MPW_ALLOWED
    bool enhanced_mpw = false;        ///< MLX5DV_CONTEXT_FLAGS_ENHANCED_MPW
    bool cqe_128b_compression = false; ///< MLX5DV_CONTEXT_FLAGS_CQE_128B_COMP
    bool cqe_128b_padding = false;    ///< MLX5DV_CONTEXT_FLAGS_CQE_128B_PAD
    std::uint32_t cqe_compression_max = 0;     ///< 0: no CQE compression
    std::uint32_t cqe_compression_formats = 0; ///< enum mlx5dv_cqe_comp_res_format
    std::uint32_t dc_odp_caps = 0;             ///< enum ibv_odp_transport_cap_bits
    std::uint32_t tunnel_offloads = 0; ///< enum mlx5dv_tunnel_offloads (0: not reported)
    std::uint8_t lag_ports = 0;        ///< LAG ports (0: not reported)
    std::size_t max_wr_memcpy_length = 0; ///< longest mlx5dv_wr_memcpy, in bytes (0: not reported)
};

/// The device's mlx5 capabilities. A non-mlx5 device is an Error.
/// @errors A device that is not an mlx5 device, or a build without mlx5dv
/// (unsupported); mlx5dv_query_device's failure (its errno).
/// @misuse A moved-from Context.
Result<DeviceCaps> query(const Context& context, std::source_location where = std::source_location::current());

/// On-device memory (ibv_alloc_dm(3)), read and written with copies. A device without
/// device memory (rxe, most non-mlx5 devices) is an Error of kind unsupported.
/// Move-only; it keeps its device open.
/// @threadsafety Distinct objects: safe. Shared objects: unsafe.
class DeviceMemory : detail::MoveOnly {
public:
    /// `size` bytes of the device's memory.
    /// @errors A device without device memory (unsupported); ibv_alloc_dm's other
    /// failures (their errno: the memory exhausted, say).
    /// @misuse A moved-from Context, size 0.
    static Result<DeviceMemory> allocate(const Context& context, std::size_t size,
                                         std::source_location where = std::source_location::current());

    /// Its size in bytes, as allocated.
    std::size_t size() const noexcept { return size_; }
    /// Copies `bytes` into the device memory at `offset` (ibv_memcpy_to_dm).
    /// @errors ibv_memcpy_to_dm's failure (its errno).
    /// @misuse A moved-from DeviceMemory; offset + bytes past the end.
    Result<void> copy_to(std::size_t offset, std::span<const std::byte> bytes,
                         std::source_location where = std::source_location::current());
    /// Copies the device memory at `offset` into `bytes` (ibv_memcpy_from_dm).
    /// @errors ibv_memcpy_from_dm's failure (its errno).
    /// @misuse A moved-from DeviceMemory; offset + bytes past the end.
    Result<void> copy_from(std::size_t offset, std::span<std::byte> bytes,
                           std::source_location where = std::source_location::current()) const;
    /// The verbs handle. @misuse A moved-from DeviceMemory.
    ibv_dm* get(std::source_location where = std::source_location::current()) const { return handle(where).get(); }
    /// The verbs handle as shared ownership (what holds the device open).
    /// @misuse A moved-from DeviceMemory.
    const std::shared_ptr<ibv_dm>& handle(std::source_location where = std::source_location::current()) const {
        return rdmaxx::detail::live(dm_, "DeviceMemory", where);
    }

private:
    DeviceMemory(std::shared_ptr<ibv_dm> dm, std::size_t size) : dm_(std::move(dm)), size_(size) {}
    std::shared_ptr<ibv_dm> dm_; // keeps the device open
    std::size_t size_;
};

/// Device memory registered as a memory region (ibv_reg_dm_mr, ibv_alloc_dm(3)). It is
/// zero-based (IBV_ACCESS_ZERO_BASED, which ibv_reg_dm_mr requires): addresses in work
/// requests are offsets into the device memory, not host pointers. There is therefore
/// no LocalSlice (whose data() is a host pointer): a local scatter/gather entry comes
/// from sge(), and a peer gets remote(), whose addr is 0 and slices like any other.
/// IBV_SEND_INLINE cannot read device memory (mlx5dv_create_qp(3), NOTES).
/// Move-only; it keeps its PD and its device memory alive.
/// @threadsafety Distinct objects: safe. Shared objects: unsafe.
class DeviceMemoryRegion : detail::MoveOnly {
public:
    /// Registers all of `memory` in `pd` with `access` plus zero_based.
    /// @errors A device that cannot register device memory (unsupported);
    /// ibv_reg_dm_mr's other failures (their errno).
    /// @misuse A moved-from PD or DeviceMemory, a PD of another device.
    static Result<DeviceMemoryRegion> register_memory(const ProtectionDomain& pd, const DeviceMemory& memory,
                                                      Access access,
                                                      std::source_location where = std::source_location::current());

    /// Its size in bytes: all of its device memory.
    std::size_t size() const noexcept { return size_; }
    /// The rights it was registered with, zero_based included.
    Access access() const noexcept { return access_; }
    /// The local key, for scatter/gather entries. @misuse A moved-from region.
    std::uint32_t lkey(std::source_location where = std::source_location::current()) const;
    /// The remote key, for peers. @misuse A moved-from region.
    std::uint32_t rkey(std::source_location where = std::source_location::current()) const;
    /// Bytes [offset, offset + length) as a local scatter/gather entry.
    /// @misuse A moved-from region; past the end, a length above 4 GiB - 1.
    ibv_sge sge(std::size_t offset, std::size_t length,
                std::source_location where = std::source_location::current()) const;
    /// The descriptor to hand to a peer: {0, size, rkey}. @misuse A moved-from region.
    RemoteMemory remote(std::source_location where = std::source_location::current()) const;
    /// The verbs handle. @misuse A moved-from region.
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
