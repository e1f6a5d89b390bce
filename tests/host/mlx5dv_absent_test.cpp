// lib/mlx5dv compiled without mlx5dv: the same declarations, every answer an Error.
// Registered twice: on the host (no RDMA device: the cases that need verbs objects
// are skipped, visibly) and in the device suite, where rxe0 gives them a PD and CQs.
#include <string>

#include <doctest/doctest.h>

#include <rdmaxx/mlx5dv/dc.hpp>
#include <rdmaxx/mlx5dv/mlx5dv.hpp>
#include <rdmaxx/wrap.hpp>

#include "../support/check.hpp"

using namespace rdmaxx;
using rdmaxx::test::must;
using rdmaxx::test::must_fail;

namespace {

void check_no_mlx5dv(const Error& e) {
    INFO(e.message());
    CHECK(e.kind() == Error::Kind::unsupported);
    CHECK(e.message().find("no mlx5dv support") != std::string::npos);
}

const bool have_device = !list_devices().value_or(std::vector<DeviceInfo>{}).empty();

} // namespace

TEST_CASE("a build without mlx5dv answers every call with an unsupported Error") {
    CHECK_FALSE(mlx5::built_with_mlx5dv());
    check_no_mlx5dv(must_fail(mlx5::is_supported("mlx5_0")));
    check_no_mlx5dv(must_fail(mlx5::open("mlx5_0")));
}

TEST_CASE("a build without mlx5dv still encodes and decodes DC endpoints") {
    const mlx5::DcEndpoint endpoint{.dctn = 0xabc, .dc_key = 42, .gid = {}, .lid = 9, .mtu = Mtu::b2048};
    CHECK(must(mlx5::DcEndpoint::parse(endpoint.serialize())) == endpoint);
}

TEST_CASE("without mlx5dv, DC targets and initiators are unsupported Errors on a real device" *
          doctest::skip(!have_device)) {
    const Context context = must(Context::open());
    const ProtectionDomain pd = must(ProtectionDomain::create(context));
    const CompletionQueue cq = must(CompletionQueue::create(context, {.depth = 16}));
    const SharedReceiveQueue srq = must(SharedReceiveQueue::create(pd, {.max_wr = 16}));
    check_no_mlx5dv(must_fail(mlx5::query(context)));
    check_no_mlx5dv(must_fail(mlx5::DcTarget::create(pd, {.cq = &cq, .srq = &srq})));
    check_no_mlx5dv(must_fail(mlx5::DcInitiator::create(pd, {.cq = &cq})));
}
