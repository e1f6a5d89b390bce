/// @file
/// An opened RDMA device. Every object created from it (PD, CQ, QP, ...) holds a
/// counted reference to the device, so objects may be destroyed in any order: the
/// device is closed when the last of them goes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include <infiniband/verbs.h>

#include <rdmaxx/wrap/device.hpp>
#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx {

namespace detail {
// Base of every wrapper: a verbs object has one owner, so wrappers move but never copy.
struct MoveOnly {
    MoveOnly() = default;
    MoveOnly(const MoveOnly&) = delete;
    MoveOnly& operator=(const MoveOnly&) = delete;
    MoveOnly(MoveOnly&&) = default;
    MoveOnly& operator=(MoveOnly&&) = default;
};

// Shared by the Context and all its children. Device attributes are read once at
// open: children check their limits without a system call.
struct DeviceState {
    ibv_context* context;
    std::string name;
    DeviceAttributes attributes;
    ~DeviceState();
};
using DeviceHandle = std::shared_ptr<const DeviceState>;

// What Context offers, for children that hold only the handle.
Result<PortAttributes> query_port(const DeviceState& device, std::uint8_t port);
Result<std::vector<GidEntry>> query_gids(const DeviceState& device);
Result<GidEntry> choose_gid(const DeviceState& device, std::uint8_t port, std::optional<std::uint32_t> index);
} // namespace detail

/// Environment variable that overrides a default (not an explicit argument): the name
/// of the device Context::open opens when given none.
inline constexpr const char* device_env = "RDMAXX_DEVICE";
/// Environment variable that overrides a default (not an explicit argument): the GID
/// table index Context::choose_gid (and so QueuePair::create) takes when given none.
inline constexpr const char* gid_index_env = "RDMAXX_GID_INDEX";

/// An opened RDMA device: an `ibv_context` and its attributes, read once when it is
/// opened. Every object created from it holds a counted reference to it, so objects may
/// be destroyed in any order: the device is closed when the last of them goes.
///
/// @threadsafety Distinct objects: safe. Shared objects: safe, but for moving to or
/// from one: every other member is const and changes nothing (the queries it makes are
/// thread-safe verbs calls).
class Context : detail::MoveOnly {
public:
    /// Opens the device `name`; an empty name means $RDMAXX_DEVICE if set, else the
    /// first device of the list. No device, or no device of that name: an Error that
    /// lists the devices present.
    ///
    /// @errors ibv_get_device_list fails; no device, or none named `name` (ENODEV);
    /// ibv_open_device or ibv_query_device fails.
    static Result<Context> open(std::string_view name = {});
    /// Takes ownership of a context opened some other way (mlx5dv_open_device, ...):
    /// it is closed with ibv_close_device when the last object using it goes.
    ///
    /// @errors ibv_query_device fails (the context is closed then too).
    /// @misuse A null context.
    static Result<Context> adopt(ibv_context* context, std::source_location where = std::source_location::current());

    /// The device's name (mlx5_0, rxe0, ...).
    ///
    /// @misuse A moved-from Context.
    const std::string& name(std::source_location where = std::source_location::current()) const;
    /// The device's attributes and limits, read once when it was opened.
    ///
    /// @misuse A moved-from Context.
    const DeviceAttributes& attributes(std::source_location where = std::source_location::current()) const;

    /// A port's attributes now (a system call). Ports are numbered from 1.
    ///
    /// @errors ibv_query_port fails (no such port).
    /// @misuse A moved-from Context.
    Result<PortAttributes> query_port(std::uint8_t port = 1,
                                      std::source_location where = std::source_location::current()) const;
    /// Every valid entry of every port's GID table.
    ///
    /// @errors ibv_query_port or ibv_query_gid_table fails.
    /// @misuse A moved-from Context.
    Result<std::vector<GidEntry>> query_gids(std::source_location where = std::source_location::current()) const;
    /// The GID rdmaxx uses on `port`: `index` if given, else $RDMAXX_GID_INDEX if set,
    /// else `preferred_gid()`. An index that holds no valid GID is an Error.
    ///
    /// @errors $RDMAXX_GID_INDEX is not a number, or the index is above
    /// max_usable_gid_index or holds no valid GID on `port` (EINVAL); no usable GID on
    /// `port` (ENOENT); ibv_query_port or ibv_query_gid_table fails.
    /// @misuse A moved-from Context.
    Result<GidEntry> choose_gid(std::uint8_t port = 1, std::optional<std::uint32_t> index = {},
                                std::source_location where = std::source_location::current()) const;

    /// The verbs context, for calls rdmaxx does not wrap.
    ///
    /// @misuse A moved-from Context.
    ibv_context* get(std::source_location where = std::source_location::current()) const {

        return detail::live(device_, "Context", where)->context;

    }
    /// The counted device state, for layers that create verbs objects of their own: a
    /// child that holds it keeps the device open.
    ///
    /// @misuse A moved-from Context.
    const detail::DeviceHandle& handle(std::source_location where = std::source_location::current()) const;

private:
    explicit Context(detail::DeviceHandle device) : device_(std::move(device)) {}
    detail::DeviceHandle device_;
};

} // namespace rdmaxx
