// rdmaxx-post-cost VARIANT [N]: posts N single-SGE RDMA WRITEs on the default device
// (a QP connected to a second QP of this process) through one of five paths, each in
// an extern "C" function of its own so that callgrind can count its instructions
// alone (bench/post-cost.sh): raw ibv_post_send, raw ibv_wr_*, and rdmaxx's SendBatch
// on a classic QP and on an extended one. Every completion is taken (outside the
// counted functions) and must be a success; the exit code says whether all were.
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include <infiniband/verbs.h>

#include <rdmaxx/data/post.hpp>
#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/cq.hpp>
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/pd.hpp>
#include <rdmaxx/wrap/qp.hpp>

using namespace rdmaxx;

extern "C" {
[[gnu::noinline]] int raw_classic_post(ibv_qp* qp, ibv_send_wr* wr, std::uint64_t i) {
    wr->wr_id = i;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, wr, &bad);
}
[[gnu::noinline]] int raw_extended_post(ibv_qp_ex* qpx, const ibv_sge* sge, std::uint32_t rkey,
                                        std::uint64_t remote, std::uint64_t i) {
    ibv_wr_start(qpx);
    qpx->wr_id = i;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(qpx, rkey, remote);
    ibv_wr_set_sge(qpx, sge->lkey, sge->addr, sge->length);
    return ibv_wr_complete(qpx);
}
[[gnu::noinline]] bool rdmaxx_classic_post(SendBatch<1>* batch, std::uint64_t i) {
    return batch->set_wr_id(0, i).post().has_value();
}
[[gnu::noinline]] bool rdmaxx_extended_post(SendBatch<1>* batch, std::uint64_t i) {
    return batch->set_wr_id(0, i).post().has_value();
}
}

namespace {

template <class T>
T must(Result<T> r, const char* what) {
    if (!r) {
        std::fprintf(stderr, "%s: %s\n", what, r.error().message().c_str());
        std::exit(2);
    }
    if constexpr (!std::is_void_v<T>)
        return std::move(*r);
}

// Takes the completion of WR `i`: it must be a success.
bool complete(const CompletionQueue& cq, std::uint64_t i) {
    ibv_wc wc{};
    for (long spins = 0; spins < 100'000'000; ++spins) {
        const int n = ibv_poll_cq(cq.get(), 1, &wc);
        if (n < 0)
            return false;
        if (n == 1)
            return wc.status == IBV_WC_SUCCESS && wc.wr_id == i;
    }
    return false;
}

} // namespace

int main(int argc, char** argv) {
    const std::string_view variant = argc > 1 ? argv[1] : "";
    const std::uint64_t n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 10'000;
    const bool extended_qp = variant == "raw_extended" || variant == "rdmaxx_extended";
    if (!extended_qp && variant != "raw_classic" && variant != "rdmaxx_classic") {
        std::fprintf(stderr, "usage: %s raw_classic|raw_extended|rdmaxx_classic|rdmaxx_extended [N]\n", argv[0]);
        return 2;
    }
    Context context = must(Context::open(), "open");
    ProtectionDomain pd = must(ProtectionDomain::create(context), "pd");
    CompletionQueue cq = must(CompletionQueue::create(context, {.depth = 256}), "cq");
    const PostApi api = extended_qp ? PostApi::extended : PostApi::classic;
    QueuePair a = must(QueuePair::create(pd, {.send_cq = &cq, .recv_cq = &cq, .post_api = api}), "qp");
    QueuePair b = must(QueuePair::create(pd, {.send_cq = &cq, .recv_cq = &cq, .post_api = api}), "qp");
    must(a.connect(b.endpoint()), "connect");
    must(b.connect(a.endpoint()), "connect");
    MemoryRegion mr = must(MemoryRegion::allocate(pd, 4096, access_all), "mr");
    const LocalSlice local = mr.slice(0, 64);
    const RemoteMemory remote = mr.remote().slice(1024, 64);

    SendBatch<1> batch(a);
    batch.write(local, remote);
    ibv_sge sge = local.sge();
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote.addr;
    wr.wr.rdma.rkey = remote.rkey;

    std::uint64_t ok = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
        bool posted = false;
        if (variant == "raw_classic")
            posted = raw_classic_post(a.get(), &wr, i) == 0;
        else if (variant == "raw_extended")
            posted = raw_extended_post(a.extended(), &sge, remote.rkey, remote.addr, i) == 0;
        else if (variant == "rdmaxx_classic")
            posted = rdmaxx_classic_post(&batch, i);
        else
            posted = rdmaxx_extended_post(&batch, i);
        ok += posted && complete(cq, i) ? 1 : 0;
    }
    std::printf("%.*s: %llu of %llu posts completed\n", static_cast<int>(variant.size()), variant.data(),
                static_cast<unsigned long long>(ok), static_cast<unsigned long long>(n));
    return ok == n ? 0 : 1;
}
