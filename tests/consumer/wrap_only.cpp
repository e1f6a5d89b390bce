// Uses the wrap layer alone.
#include <cstdio>

#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/mr.hpp>

int main() {
    const rdmaxx::RemoteMemory remote{.addr = 4096, .length = 64, .rkey = 7};
    auto parsed = rdmaxx::RemoteMemory::parse(remote.serialize());
    std::printf("wrap only: %s\n", parsed && *parsed == remote ? "ok" : "broken");
    return parsed && *parsed == remote ? 0 : 1;
}
