#include <algorithm>
#include <array>
#include <functional>
#include <numeric>
#include <optional>

#include <doctest/doctest.h>

#include "../support/device.hpp"

using namespace rdmaxx;
using rdmaxx::test::must;

namespace {

// Destroys `objects` in every order of their indices.
template <std::size_t N>
void for_each_order(const std::function<void(std::array<std::function<void()>, N>&)>& make) {
    std::array<std::size_t, N> order;
    std::iota(order.begin(), order.end(), 0);
    do {
        std::array<std::function<void()>, N> destroy;
        make(destroy);
        for (const std::size_t i : order)
            destroy[i]();
    } while (std::next_permutation(order.begin(), order.end()));
}

} // namespace

TEST_CASE("context, PD, CQ, MR, SRQ and QP may be destroyed in every order") {
    int rounds = 0;
    for_each_order<6>([&](auto& destroy) {
        ++rounds;
        auto context = std::make_shared<std::optional<Context>>(must(Context::open()));
        auto pd = std::make_shared<std::optional<ProtectionDomain>>(must(ProtectionDomain::create(**context)));
        auto cq = std::make_shared<std::optional<CompletionQueue>>(
            must(CompletionQueue::create(**context, {.depth = 8, .channel = true})));
        auto mr = std::make_shared<std::optional<MemoryRegion>>(must(MemoryRegion::allocate(**pd, 64, access_all)));
        auto srq = std::make_shared<std::optional<SharedReceiveQueue>>(
            must(SharedReceiveQueue::create(**pd, {.max_wr = 4})));
        auto qp = std::make_shared<std::optional<QueuePair>>(must(QueuePair::create(
            **pd, {.send_cq = &**cq, .recv_cq = &**cq, .srq = &**srq, .caps = {.max_send_wr = 4}})));
        destroy = {[=] { context->reset(); }, [=] { pd->reset(); }, [=] { cq->reset(); },
                   [=] { mr->reset(); },      [=] { srq->reset(); }, [=] { qp->reset(); }};
    });
    CHECK(rounds == 720);
    CHECK(test::leftover_resources().empty());
}

TEST_CASE("a UD QP and its address handle may be destroyed in every order with their parents") {
    for_each_order<5>([&](auto& destroy) {
        auto context = std::make_shared<std::optional<Context>>(must(Context::open()));
        auto pd = std::make_shared<std::optional<ProtectionDomain>>(must(ProtectionDomain::create(**context)));
        auto cq = std::make_shared<std::optional<CompletionQueue>>(must(CompletionQueue::create(**context)));
        auto qp = std::make_shared<std::optional<QueuePair>>(
            must(QueuePair::create(**pd, {.type = QpType::ud, .send_cq = &**cq, .recv_cq = &**cq})));
        auto ah = std::make_shared<std::optional<AddressHandle>>(must(AddressHandle::create(**qp, (*qp)->endpoint())));
        destroy = {[=] { context->reset(); }, [=] { pd->reset(); }, [=] { cq->reset(); }, [=] { qp->reset(); },
                   [=] { ah->reset(); }};
    });
    CHECK(test::leftover_resources().empty());
}

TEST_CASE("leftover resources are visible while objects live") {
    test::Rig rig;
    const QueuePair qp = rig.make_qp(QpType::rc);
    const auto alive = test::leftover_resources();
    CHECK(std::any_of(alive.begin(), alive.end(), [](const std::string& l) { return l.starts_with("qp:"); }));
    CHECK(std::any_of(alive.begin(), alive.end(), [](const std::string& l) { return l.starts_with("pd:"); }));
}
