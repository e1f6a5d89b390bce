// Inline sends: a send of up to its QP's max_inline_data bytes has the post copy the
// bytes into the WR, so the device reads no local key for them (on rxe, the kernel's
// key lookup per SGE for every packet), as perftest's latency tests send. QP creation
// is the only way libibverbs tells a device's limit: a transport creates its QPs with
// the largest of inline_tries the device takes.
//
// Thread safety: stateless.
#pragma once

#include <cstdint>
#include <iterator>

#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/qp.hpp>

namespace rdmaxx::rpc::detail {

inline constexpr std::uint32_t inline_tries[] = {256, 128, 64, 0};

// `create(max_inline_data)` for each of inline_tries up to `at_most` in turn, until
// one is created: that QP, or the last try's error.
template <class Create>
Result<QueuePair> create_inlined(Create&& create, std::uint32_t at_most = inline_tries[0]) {
    std::size_t i = 0;
    while (i + 1 < std::size(inline_tries) && inline_tries[i] > at_most)
        ++i;
    auto qp = create(inline_tries[i]);
    while (!qp && ++i < std::size(inline_tries))
        qp = create(inline_tries[i]);
    return qp;
}

} // namespace rdmaxx::rpc::detail
