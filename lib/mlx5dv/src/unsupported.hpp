// The two "not here" answers of lib/mlx5dv, shared by its sources; each build
// defines the one it gives.
#pragma once

#include <string_view>

#include <rdmaxx/wrap/error.hpp>

namespace rdmaxx::mlx5::unsupported {

// This build has no mlx5dv (compiled with RDMAXX_HAVE_MLX5DV=0).
Error no_mlx5dv(const char* call);
// `device` is not driven by the mlx5 provider (compiled with RDMAXX_HAVE_MLX5DV=1).
Error not_mlx5(const char* call, std::string_view device);

} // namespace rdmaxx::mlx5::unsupported
