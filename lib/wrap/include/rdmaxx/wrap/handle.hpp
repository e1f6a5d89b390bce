/// @file
/// Ownership helpers of the wrap layer, shared with the layers that create verbs
/// objects of their own (lib/mlx5dv): not part of the user-facing API.
#pragma once

#include <memory>
#include <tuple>
#include <utility>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/log.hpp>

namespace rdmaxx::detail {

// Takes ownership of a verbs object: `destroy` runs when the last reference goes,
// then the references in `keep` (the object's parents) are released, so a parent
// always outlives its children whatever order the wrappers die in. A failing destroy
// cannot be returned from a destructor: it is logged as an error, never ignored, and
// the parents are leaked, not released: the object lives on in the device and may
// still reach them (an MR its memory, which a window still bound to it exposes to the
// network: rxe refuses ibv_dereg_mr then, and the memory went back to malloc).
template <class T, class... Keep>
std::shared_ptr<T> adopt(T* object, const char* destroy_call, int (*destroy)(T*), Keep... keep) {
    return std::shared_ptr<T>(object, [destroy_call, destroy, ... keep = std::move(keep)](T* p) mutable {
        if (const int rc = destroy(p); rc != 0) {
            logger()->error("{}: it and what it keeps alive are leaked",
                            Error::from_errno(destroy_call, rc > 0 ? rc : errno));
            (void)new std::tuple<Keep...>(std::move(keep)...);
        }
    });
}

// A pointer into an object that a shared_ptr beside it owns (an ibv_qp_ex of its
// ibv_qp): a move leaves it null, as it leaves the owner, so that a moved-from wrapper
// cannot reach the object through it.
template <class T>
class OwnedElsewhere {
public:
    OwnedElsewhere() = default;
    explicit OwnedElsewhere(T* p) noexcept : p_(p) {}
    OwnedElsewhere(OwnedElsewhere&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
    OwnedElsewhere& operator=(OwnedElsewhere&& other) noexcept {
        p_ = std::exchange(other.p_, nullptr);
        return *this;
    }
    T* get() const noexcept { return p_; }

private:
    T* p_ = nullptr;
};

} // namespace rdmaxx::detail
