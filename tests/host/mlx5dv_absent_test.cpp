// lib/mlx5dv compiled without mlx5dv: the same declarations, every answer an Error.
#include <doctest/doctest.h>

#include <rdmaxx/mlx5dv/mlx5dv.hpp>

#include "../support/check.hpp"

using namespace rdmaxx;
using rdmaxx::test::must_fail;

TEST_CASE("a build without mlx5dv answers every call with an unsupported Error") {
    CHECK_FALSE(mlx5::built_with_mlx5dv());
    for (const Error& e : {must_fail(mlx5::is_supported("mlx5_0")), must_fail(mlx5::open("mlx5_0"))}) {
        CHECK(e.kind() == Error::Kind::unsupported);
        CHECK(e.message().find("no mlx5dv support") != std::string::npos);
    }
}
