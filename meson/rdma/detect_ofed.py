#!/usr/bin/env python3
"""Looks for an MLNX_OFED installation under ROOT (/ on a real machine; the tests
build fake trees) and prints what it found as key=value lines for meson:

  found       yes | no | partial (markers, but not the headers and libraries to build with)
  generation  4.x (experimental verbs: verbs_exp.h) | 5.x (upstream rdma-core inside)
  version     e.g. MLNX_OFED_LINUX-5.8-1.0.1.1, or unknown
  markers     the markers seen: ofed_info, /etc/infiniband/info, infiniband/verbs_exp.h
  pkgconfig   5.x: the directory of its libibverbs.pc
  include     4.x: the include directory; libdir: the library directory
  reason      one sentence for meson's summary
"""
import os
import re
import shutil
import subprocess
import sys

VERSION = re.compile(r"MLNX_OFED_LINUX-[0-9][^\s:\"']*")


def detect(root):
    def path(*parts):
        return os.path.join(root, *[p.lstrip("/") for p in parts])

    markers, version = [], "unknown"
    ofed_info = path("usr/bin/ofed_info")
    if not os.access(ofed_info, os.X_OK) and root == "/":
        ofed_info = shutil.which("ofed_info") or ""
    if ofed_info and os.access(ofed_info, os.X_OK):
        markers.append("ofed_info")
        try:
            found = VERSION.search(subprocess.run([ofed_info, "-s"], capture_output=True, text=True,
                                                  timeout=10).stdout)
            version = found.group(0) if found else version
        except (OSError, subprocess.SubprocessError):
            pass
    info = path("etc/infiniband/info")
    if os.path.isfile(info):
        markers.append("/etc/infiniband/info")
        if version == "unknown":
            with open(info, errors="replace") as f:
                found = VERSION.search(f.read())
                version = found.group(0) if found else version
    include = path("usr/include")
    experimental = os.path.isfile(os.path.join(include, "infiniband", "verbs_exp.h"))
    if experimental:
        markers.append("infiniband/verbs_exp.h")
    if not markers:
        return {"found": "no", "reason": "no MLNX_OFED marker (ofed_info, /etc/infiniband/info, verbs_exp.h)"}

    generation = "4.x" if experimental or version.startswith("MLNX_OFED_LINUX-4.") else "5.x"
    libdirs = ("usr/lib64", "usr/lib", "usr/lib/x86_64-linux-gnu")
    pkgconfig = next((path(d, "pkgconfig") for d in libdirs if os.path.isfile(path(d, "pkgconfig", "libibverbs.pc"))), "")
    libdir = next((path(d) for d in libdirs if os.path.exists(path(d, "libibverbs.so"))), "")
    result = {"generation": generation, "version": version, "markers": ",".join(markers), "pkgconfig": pkgconfig,
              "include": include, "libdir": libdir}
    if generation == "5.x":
        missing = "" if pkgconfig else "libibverbs.pc"
    else:
        missing = ", ".join(m for m, ok in (("infiniband/verbs.h", os.path.isfile(os.path.join(include, "infiniband",
                                                                                                "verbs.h"))),
                                            ("libibverbs.so", bool(libdir))) if not ok)
    if missing:
        result.update(found="partial", reason=f"MLNX_OFED {generation} markers ({result['markers']}) but no {missing}")
    else:
        result.update(found="yes", reason=f"MLNX_OFED {version} ({generation}) found by {result['markers']}")
    return result


if __name__ == "__main__":
    for key, value in detect(sys.argv[1] if len(sys.argv) > 1 else "/").items():
        print(f"{key}={value}")
