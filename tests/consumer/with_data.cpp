// Uses the data layer (and through it the wrap layer).
#include <cstdio>

#include <rdmaxx/data/completion.hpp>
#include <rdmaxx/data/post.hpp>

int main() {
    std::printf("data: %s\n", rdmaxx::to_string(rdmaxx::WcOpcode::rdma_write).data());
    return 0;
}
