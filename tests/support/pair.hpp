// Fixtures for tests between two devices over a wire: scripts/vm/pair.sh makes rxeA
// and rxeB (RDMAXX_PAIR_* name them); elsewhere such tests are skipped.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include <doctest/doctest.h>
#include <fmt/format.h>

namespace rdmaxx::test {

inline const char* env(const char* name) {
    const char* value = std::getenv(name);
    return value ? value : "";
}

inline bool have_pair() { return *env("RDMAXX_PAIR_A_DEV") && *env("RDMAXX_PAIR_B_DEV"); }

// A netem rule on an interface for the scope's duration: removed even when a check fails.
class Netem {
public:
    Netem(const char* interface, const std::string& rule) : interface_(interface) {
        const std::string command = fmt::format("tc qdisc add dev {} root netem {}", interface_, rule);
        REQUIRE_MESSAGE(std::system(command.c_str()) == 0, command);
    }
    Netem(const Netem&) = delete;
    Netem& operator=(const Netem&) = delete;
    ~Netem() {
        const std::string command = fmt::format("tc qdisc del dev {} root", interface_);
        if (std::system(command.c_str()) != 0)
            std::fprintf(stderr, "could not remove the netem rule on %s\n", interface_.c_str());
    }

private:
    std::string interface_;
};

} // namespace rdmaxx::test
