// rdmaxx-copy: copies files between two hosts over RDMA (see --help, or
// rdmaxx-copy(1)). `--serve DIR` on one side, `FILE... HOST:[PATH]` on the other.
#include <cstdlib>

#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "options.hpp"
#include "run.hpp"

int main(int argc, char** argv) {
    const std::vector<std::string_view> args(argv + 1, argv + argc);
    auto options = rdmaxx::copy::parse_options(args);
    if (!options) {
        fmt::print(stderr, "rdmaxx-copy: {}\n", options.error().detail());
        return 2;
    }
    if (options->help) {
        fmt::print("{}", rdmaxx::copy::manual());
        return 0;
    }
    return options->serve ? rdmaxx::copy::serve(*options) : rdmaxx::copy::send_files(*options);
}
