#include <rdmaxx/mlx5dv/mlx5dv.hpp>

#include <limits>
#include <memory>
#include <string>

#include <fmt/format.h>

#include <rdmaxx/wrap/handle.hpp>
#include <rdmaxx/wrap/log.hpp>

#include "unsupported.hpp"

#if RDMAXX_HAVE_MLX5DV
#include <infiniband/mlx5dv.h>
#endif

namespace rdmaxx::mlx5 {

#if RDMAXX_HAVE_MLX5DV
Error unsupported::not_mlx5(const char* call, std::string_view device) {
    return Error::unsupported(call, fmt::format("{} is not an mlx5 device", device));
}
#else
Error unsupported::no_mlx5dv(const char* call) {
    return Error::unsupported(call, "this build of rdmaxx has no mlx5dv support (infiniband/mlx5dv.h or libmlx5 "
                                    "was not found, or -Dmlx5dv=disabled)");
}
#endif

namespace {

#if RDMAXX_HAVE_MLX5DV
using DeviceList = std::unique_ptr<ibv_device*[], decltype(&ibv_free_device_list)>;

// The device named `name` from a fresh list (kept alive by `list`).
Result<ibv_device*> find(std::string_view name, DeviceList& list) {
    int count = 0;
    list.reset(ibv_get_device_list(&count));
    if (!list)
        return std::unexpected(Error::from_last_errno("ibv_get_device_list"));
    for (int i = 0; i < count; ++i)
        if (name == ibv_get_device_name(list[i]))
            return list[i];
    return std::unexpected(Error::from_errno("ibv_get_device_list", ENODEV, fmt::format("no RDMA device named '{}'", name)));
}
#endif

// The failure of a device-memory verb, from its errno (read before the messages are
// made: formatting may change it): a device (or provider) without the feature is an
// unsupported Error saying `missing`, anything else a system one.
Error device_memory_error(const char* call, int error, std::string missing, std::string detail) {
    if (error == EOPNOTSUPP || error == ENOSYS)
        return Error::unsupported(call, std::move(missing));
    return Error::from_errno(call, error != 0 ? error : EIO, std::move(detail));
}

} // namespace

bool built_with_mlx5dv() noexcept { return RDMAXX_HAVE_MLX5DV != 0; }

Result<bool> is_supported(std::string_view device) {
#if RDMAXX_HAVE_MLX5DV
    DeviceList list(nullptr, &ibv_free_device_list);
    auto found = find(device, list);
    if (!found)
        return std::unexpected(std::move(found.error()));
    return mlx5dv_is_supported(*found);
#else
    (void)device;
    return std::unexpected(unsupported::no_mlx5dv("mlx5::is_supported"));
#endif
}

Result<Context> open(std::string_view device, OpenOptions options) {
#if RDMAXX_HAVE_MLX5DV
    DeviceList list(nullptr, &ibv_free_device_list);
    auto found = find(device, list);
    if (!found)
        return std::unexpected(std::move(found.error()));
    if (!mlx5dv_is_supported(*found))
        return std::unexpected(unsupported::not_mlx5("mlx5dv_open_device", device));
    mlx5dv_context_attr attr{.flags = options.devx ? std::uint32_t{MLX5DV_CONTEXT_FLAGS_DEVX} : 0u, .comp_mask = 0};
    ibv_context* context = mlx5dv_open_device(*found, &attr);
    if (!context)
        return std::unexpected(Error::from_last_errno("mlx5dv_open_device", "{}", device));
    return Context::adopt(context);
#else
    (void)device, (void)options;
    return std::unexpected(unsupported::no_mlx5dv("mlx5::open"));
#endif
}

Result<DeviceCaps> query(const Context& context, std::source_location where) {
    ibv_context* raw = context.get(where);
#if RDMAXX_HAVE_MLX5DV
    if (!mlx5dv_is_supported(raw->device))
        return std::unexpected(unsupported::not_mlx5("mlx5dv_query_device", context.name()));
    mlx5dv_context attrs{};
    attrs.comp_mask = MLX5DV_CONTEXT_MASK_CQE_COMPRESION | MLX5DV_CONTEXT_MASK_DC_ODP_CAPS |
                      MLX5DV_CONTEXT_MASK_TUNNEL_OFFLOADS | MLX5DV_CONTEXT_MASK_NUM_LAG_PORTS |
                      MLX5DV_CONTEXT_MASK_WR_MEMCPY_LENGTH;
    if (const int rc = mlx5dv_query_device(raw, &attrs); rc != 0)
        return std::unexpected(Error::from_errno("mlx5dv_query_device", rc, context.name()));
    // comp_mask on return says which of the asked-for fields the device filled in
    const auto has = [&](std::uint64_t field) { return (attrs.comp_mask & field) != 0; };
    return DeviceCaps{
        .version = attrs.version,
        .flags = attrs.flags,
        .cqe_v1 = (attrs.flags & MLX5DV_CONTEXT_FLAGS_CQE_V1) != 0,
        .mpw_allowed = (attrs.flags & MLX5DV_CONTEXT_FLAGS_MPW_ALLOWED) != 0,
        .enhanced_mpw = (attrs.flags & MLX5DV_CONTEXT_FLAGS_ENHANCED_MPW) != 0,
        .cqe_128b_compression = (attrs.flags & MLX5DV_CONTEXT_FLAGS_CQE_128B_COMP) != 0,
        .cqe_128b_padding = (attrs.flags & MLX5DV_CONTEXT_FLAGS_CQE_128B_PAD) != 0,
        .cqe_compression_max = has(MLX5DV_CONTEXT_MASK_CQE_COMPRESION) ? attrs.cqe_comp_caps.max_num : 0,
        .cqe_compression_formats = has(MLX5DV_CONTEXT_MASK_CQE_COMPRESION) ? attrs.cqe_comp_caps.supported_format : 0,
        .dc_odp_caps = has(MLX5DV_CONTEXT_MASK_DC_ODP_CAPS) ? attrs.dc_odp_caps : 0,
        .tunnel_offloads = has(MLX5DV_CONTEXT_MASK_TUNNEL_OFFLOADS) ? attrs.tunnel_offloads_caps : 0,
        .lag_ports = has(MLX5DV_CONTEXT_MASK_NUM_LAG_PORTS) ? attrs.num_lag_ports : std::uint8_t{0},
        .max_wr_memcpy_length = has(MLX5DV_CONTEXT_MASK_WR_MEMCPY_LENGTH) ? attrs.max_wr_memcpy_length : 0,
    };
#else
    (void)raw;
    return std::unexpected(unsupported::no_mlx5dv("mlx5::query"));
#endif
}

Result<DeviceMemory> DeviceMemory::allocate(const Context& context, std::size_t size, std::source_location where) {
    const detail::DeviceHandle& device = context.handle(where);
    require(size > 0, where, "DeviceMemory of 0 bytes");
    ibv_alloc_dm_attr attr{.length = size, .log_align_req = 0, .comp_mask = 0};
    ibv_dm* dm = ibv_alloc_dm(device->context, &attr);
    if (!dm) {
        const int error = errno;
        return std::unexpected(device_memory_error("ibv_alloc_dm", error,
                                                   fmt::format("{} has no device memory", device->name),
                                                   fmt::format("{} bytes on {}", size, device->name)));
    }
    // the device stays open until the memory is freed
    return DeviceMemory(detail::adopt(dm, "ibv_free_dm", &ibv_free_dm, device), size);
}

Result<void> DeviceMemory::copy_to(std::size_t offset, std::span<const std::byte> bytes, std::source_location where) {
    ibv_dm* dm = get(where);
    require(offset <= size_ && bytes.size() <= size_ - offset, where, "copy_to [{}, +{}) of a {}-byte device memory",
            offset, bytes.size(), size_);
    if (const int rc = ibv_memcpy_to_dm(dm, offset, bytes.data(), bytes.size()); rc != 0)
        return std::unexpected(Error::from_errno("ibv_memcpy_to_dm", rc));
    return {};
}

Result<void> DeviceMemory::copy_from(std::size_t offset, std::span<std::byte> bytes, std::source_location where) const {
    ibv_dm* dm = get(where);
    require(offset <= size_ && bytes.size() <= size_ - offset, where,
            "copy_from [{}, +{}) of a {}-byte device memory", offset, bytes.size(), size_);
    if (const int rc = ibv_memcpy_from_dm(bytes.data(), dm, offset, bytes.size()); rc != 0)
        return std::unexpected(Error::from_errno("ibv_memcpy_from_dm", rc));
    return {};
}

Result<DeviceMemoryRegion> DeviceMemoryRegion::register_memory(const ProtectionDomain& pd, const DeviceMemory& memory,
                                                               Access access, std::source_location where) {
    const std::shared_ptr<ibv_pd>& pd_handle = pd.handle(where);
    const std::shared_ptr<ibv_dm>& dm = memory.handle(where);
    require(pd_handle->context == dm->context, where, "DeviceMemoryRegion: the PD and the device memory belong to "
                                                      "different devices");
    const Access zero_based = access | Access::zero_based;
    ibv_mr* mr = ibv_reg_dm_mr(pd_handle.get(), dm.get(), 0, memory.size(), static_cast<unsigned>(zero_based));
    if (!mr) {
        const int error = errno;
        return std::unexpected(device_memory_error("ibv_reg_dm_mr", error, "the device cannot register device memory",
                                                   fmt::format("{} bytes of device memory", memory.size())));
    }
    // deregistered before the device memory is freed and the PD deallocated
    return DeviceMemoryRegion(detail::adopt(mr, "ibv_dereg_mr", &ibv_dereg_mr, pd_handle, dm), memory.size(),
                              zero_based);
}

std::uint32_t DeviceMemoryRegion::lkey(std::source_location where) const { return get(where)->lkey; }

std::uint32_t DeviceMemoryRegion::rkey(std::source_location where) const { return get(where)->rkey; }

ibv_sge DeviceMemoryRegion::sge(std::size_t offset, std::size_t length, std::source_location where) const {
    require(offset <= size_ && length <= size_ - offset && length <= std::numeric_limits<std::uint32_t>::max(),
            where, "sge [{}, +{}) of a {}-byte device memory region: past its end, or above 4 GiB - 1", offset,
            length, size_);
    return {.addr = offset, .length = static_cast<std::uint32_t>(length), .lkey = lkey(where)};
}

RemoteMemory DeviceMemoryRegion::remote(std::source_location where) const {
    return {.addr = 0, .length = size_, .rkey = rkey(where)};
}

} // namespace rdmaxx::mlx5
