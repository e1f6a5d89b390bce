/// @file
/// Ownership helpers of the wrap layer, shared with the layers that create verbs
/// objects of their own (lib/mlx5dv): not part of the user-facing API.
#pragma once

#include <memory>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/log.hpp>

namespace rdmaxx::detail {

// Takes ownership of a verbs object: `destroy` runs when the last reference goes,
// then the references in `keep` (the object's parents) are released, so a parent
// always outlives its children whatever order the wrappers die in. A failing destroy
// cannot be returned from a destructor: it is logged as an error, never ignored.
template <class T, class... Keep>
std::shared_ptr<T> adopt(T* object, const char* destroy_call, int (*destroy)(T*), Keep... keep) {
    return std::shared_ptr<T>(object, [destroy_call, destroy, ... keep = std::move(keep)](T* p) {
        if (const int rc = destroy(p); rc != 0)
            logger()->error("{}", Error::from_errno(destroy_call, rc > 0 ? rc : errno));
    });
}

} // namespace rdmaxx::detail
