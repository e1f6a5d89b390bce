// The one way the wrap layer allocates and registers memory: MemoryRegion::allocate
// and MemoryPool's arenas.
#pragma once

#include <cstddef>
#include <memory>
#include <source_location>

#include <infiniband/verbs.h>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/mr.hpp>

namespace rdmaxx::detail {

// `size` bytes allocated as `options` ask and registered in `pd`; the memory is
// freed after the deregistration. Programming error: size 0, an alignment that is
// not a power of two.
Result<std::shared_ptr<ibv_mr>> allocate_registered(const std::shared_ptr<ibv_pd>& pd, std::size_t size,
                                                    Access access, const AllocateOptions& options,
                                                    std::source_location where);

} // namespace rdmaxx::detail
