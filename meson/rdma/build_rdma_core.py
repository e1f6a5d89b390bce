#!/usr/bin/env python3
"""Builds rdma-core's static libraries at configure time, for rdma_link=source.

  build_rdma_core.py SOURCE BUILD_DIR download|no-download

SOURCE is a release tarball, an unpacked source directory, or empty: then the pinned
release is downloaded (unless no-download) and its SHA-256 checked. Prints key=value lines (include,
archives, version) on success, `error=...` and exit 1 otherwise, saying exactly what
to provide. Needs cmake, ninja, python3, libnl-3-dev and libnl-route-3-dev.
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request

VERSION = "44.0"
URL = f"https://github.com/linux-rdma/rdma-core/releases/download/v{VERSION}/rdma-core-{VERSION}.tar.gz"
# The release tarball's SHA-256, as Debian bookworm's rdma-core_44.0-2.dsc lists it
# for rdma-core_44.0.orig.tar.gz (1930453 bytes), which is that same upstream file.
SHA256 = "25d6601e60f27bbcd75e07fe340400cb80e6c3c487679700535385cfc9d9858b"
HELP = (f"rdma_link=source needs rdma-core's source: download rdma-core-{VERSION}.tar.gz ({URL}, "
        f"SHA-256 {SHA256}) and pass -Drdma_core_source=/path/to/rdma-core-{VERSION}.tar.gz, "
        f"or -Drdma_core_source=/path/to/an/unpacked/rdma-core")


def fail(message):
    print(f"error={message}")
    sys.exit(1)


def is_rdma_core(tree):
    cmake = os.path.join(tree, "CMakeLists.txt")
    if not os.path.isfile(cmake):
        return False
    with open(cmake, errors="replace") as f:
        return re.search(r"project\s*\(\s*rdma-core", f.read(), re.IGNORECASE) is not None


def main(source, build, download):
    os.makedirs(build, exist_ok=True)
    if not source:
        source = os.path.join(build, f"rdma-core-{VERSION}.tar.gz")
        if not os.path.isfile(source) and not download:
            fail(f"no source given and downloads are off (-Drdma_core_download=false). {HELP}")
        if not os.path.isfile(source):
            try:
                with urllib.request.urlopen(URL, timeout=20) as response, open(source + ".part", "wb") as out:
                    shutil.copyfileobj(response, out)
            except OSError as e:
                fail(f"downloading {URL} failed ({e}). {HELP}")
            os.replace(source + ".part", source)
        with open(source, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != SHA256:
                os.remove(source)
                fail(f"the download does not have the pinned SHA-256. {HELP}")
    if not os.path.exists(source):
        fail(f"{source} does not exist. {HELP}")
    tree = source
    if os.path.isfile(source):
        if not tarfile.is_tarfile(source):
            fail(f"{source} is neither a directory nor a tarball. {HELP}")
        unpacked = os.path.join(build, "src")
        shutil.rmtree(unpacked, ignore_errors=True)
        with tarfile.open(source) as t:
            if hasattr(tarfile, "data_filter"):
                t.extractall(unpacked, filter="data")
            else:  # an older Python: refuse members that would land outside
                for member in t.getmembers():
                    target = os.path.realpath(os.path.join(unpacked, member.name))
                    if not target.startswith(os.path.realpath(unpacked) + os.sep) or member.issym() or member.islnk():
                        if not (member.issym() or member.islnk()) or os.path.isabs(member.linkname):
                            fail(f"{source}: member {member.name} would be unpacked outside the build directory")
                t.extractall(unpacked)
        entries = os.listdir(unpacked)
        tree = os.path.join(unpacked, entries[0]) if len(entries) == 1 else unpacked
    if not is_rdma_core(tree):
        fail(f"{source} is not an rdma-core source tree (no CMakeLists.txt declaring project(rdma-core)). {HELP}")
    out = os.path.join(build, "build")
    for step in (["cmake", "-S", tree, "-B", out, "-GNinja", "-DENABLE_STATIC=1", "-DNO_PYVERBS=1", "-DNO_MAN_PAGES=1",
                  "-DCMAKE_POSITION_INDEPENDENT_CODE=ON", "-DCMAKE_BUILD_TYPE=Release"],
                 ["ninja", "-C", out]):
        if subprocess.run(step, stdout=subprocess.DEVNULL).returncode != 0:
            fail(f"building rdma-core failed at `{' '.join(step)}` (it needs cmake, ninja, python3, libnl-3-dev, "
                 f"libnl-route-3-dev)")
    archives = sorted(os.path.join(d, f) for d, _, files in os.walk(out) for f in files
                      if f.startswith("lib") and f.endswith(".a"))
    print(f"include={os.path.join(out, 'include')}")
    print(f"archives={':'.join(archives)}")
    print(f"version={os.path.basename(os.path.normpath(tree))}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] == "download")
