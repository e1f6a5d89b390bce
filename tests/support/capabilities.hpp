// Tests that change the process's capabilities and locked-memory limit.
#pragma once

#include <array>

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <doctest/doctest.h>

namespace rdmaxx::test {

// CAP_IPC_LOCK out of the effective set while this lives (root's would lift
// RLIMIT_MEMLOCK), and the limit raised as far as it goes, for a test to lower.
// capset gives the process new credentials, even unchanged, and Soft-RoCE's posts on a
// device opened under other ones are refused (EACCES, data_flow_test): made before a
// test's devices are opened, it leaves their posts working; made after, it fails them
// all.
class WithoutIpcLock {
public:
    WithoutIpcLock() {
        REQUIRE(::syscall(SYS_capget, &header_, saved_.data()) == 0);
        auto lowered = saved_;
        lowered[CAP_TO_INDEX(CAP_IPC_LOCK)].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
        REQUIRE(::syscall(SYS_capset, &header_, lowered.data()) == 0);
        REQUIRE(::getrlimit(RLIMIT_MEMLOCK, &was_) == 0);
        const rlimit unlimited{.rlim_cur = RLIM_INFINITY, .rlim_max = RLIM_INFINITY};
        REQUIRE(::setrlimit(RLIMIT_MEMLOCK, &unlimited) == 0);
    }
    WithoutIpcLock(const WithoutIpcLock&) = delete;
    WithoutIpcLock& operator=(const WithoutIpcLock&) = delete;
    ~WithoutIpcLock() {
        ::setrlimit(RLIMIT_MEMLOCK, &was_);
        ::syscall(SYS_capset, &header_, saved_.data());
    }

private:
    __user_cap_header_struct header_{.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    std::array<__user_cap_data_struct, _LINUX_CAPABILITY_U32S_3> saved_{};
    rlimit was_{};
};

} // namespace rdmaxx::test
