// The device refusing to make any more verbs objects, for real: the kernel's rdma
// cgroup controller charges every object a process makes through ib_uverbs (a CQ, a
// QP, an MR, an AH, ...) to the process's cgroup, and refuses one (EAGAIN) beyond the
// cgroup's rdma.max. Needs root and cgroup v2, as the project's VM has (its init mounts
// no cgroup fs: it is mounted here when missing).
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include <sys/mount.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <fmt/format.h>

namespace rdmaxx::test {

// Whether NoRdmaObjects may be used here: elsewhere its cases are skipped.
inline bool may_limit_rdma_objects() { return geteuid() == 0; }

// While this lives, the process makes no verbs object on `device`: it is moved into a
// cgroup of its own whose rdma.max allows none (objects it made before stay, charged
// where they were), and back when this ends, however the test ends.
class NoRdmaObjects {
public:
    explicit NoRdmaObjects(const std::string& device) {
        if (!std::filesystem::exists(root_ / "cgroup.controllers"))
            REQUIRE_MESSAGE(mount("cgroup2", root_.c_str(), "cgroup2", 0, nullptr) == 0, "mounting cgroup2 at ",
                            root_.string());
        write(root_ / "cgroup.subtree_control", "+rdma");
        std::filesystem::create_directory(own_);
        write(own_ / "rdma.max", fmt::format("{} hca_object=0", device));
        write(own_ / "cgroup.procs", std::to_string(getpid()));
    }
    NoRdmaObjects(const NoRdmaObjects&) = delete;
    NoRdmaObjects& operator=(const NoRdmaObjects&) = delete;
    ~NoRdmaObjects() {
        std::ofstream(root_ / "cgroup.procs") << getpid() << std::flush;
        std::error_code ignored; // the cgroup goes once its charged objects do
        std::filesystem::remove(own_, ignored);
    }

private:
    static void write(const std::filesystem::path& file, const std::string& text) {
        std::ofstream out(file);
        out << text << std::flush;
        REQUIRE_MESSAGE(out.good(), "writing \"", text, "\" to ", file.string());
    }

    std::filesystem::path root_ = "/sys/fs/cgroup";
    std::filesystem::path own_ = root_ / fmt::format("rdmaxx-test-{}", getpid());
};

} // namespace rdmaxx::test
