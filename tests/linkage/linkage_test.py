#!/usr/bin/env python3
"""The linkage choice, tested without the stacks it chooses between: MLNX_OFED
detection against fake OFED trees built here (both generations, partial installs),
what `meson setup` then chooses and prints, and the from-source mode's errors.

  linkage_test.py SOURCE_ROOT
"""
import os
import re
import stat
import subprocess
import sys
import tempfile

root = sys.argv[1]
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAILED: ") + what)
    if not ok:
        failures.append(what)


def write(path, text, executable=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    if executable:
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def fake_ofed(base, version, generation, partial=False):
    """An OFED tree: ofed_info and /etc/infiniband/info, plus what that generation
    installs: 4.x verbs_exp.h, verbs.h and libibverbs.so; 5.x libibverbs.pc."""
    write(f"{base}/usr/bin/ofed_info", f"#!/bin/sh\necho {version}:\n", executable=True)
    write(f"{base}/etc/infiniband/info", f"#!/bin/bash\necho prefix=/usr\necho ofed_version={version}\n")
    if partial:
        return base
    if generation == "4.x":
        write(f"{base}/usr/include/infiniband/verbs_exp.h", "/* experimental verbs */\n")
        write(f"{base}/usr/include/infiniband/verbs.h", "/* verbs */\n")
        write(f"{base}/usr/lib64/libibverbs.so", "")
    else:
        for lib in ("libibverbs", "librdmacm"):
            write(f"{base}/usr/lib64/pkgconfig/{lib}.pc",
                  f"prefix={base}/usr\nincludedir=${{prefix}}/include\nlibdir=${{prefix}}/lib64\n"
                  f"Name: {lib}\nDescription: fake\nVersion: 58.0\nCflags: -I${{includedir}}\n"
                  f"Libs: -L${{libdir}} -l{lib[3:]}\n")
    return base


def detect(tree):
    out = subprocess.run([sys.executable, f"{root}/meson/rdma/detect_ofed.py", tree], capture_output=True,
                         text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.strip().splitlines())


def configure(work, *options):
    build = tempfile.mkdtemp(dir=work)
    run = subprocess.run(["meson", "setup", build, root, "-Dtests=false", "-Dexamples=false", *options],
                         capture_output=True, text=True)
    return run.returncode, run.stdout + run.stderr


with tempfile.TemporaryDirectory() as work:
    empty = os.path.join(work, "empty")
    os.makedirs(empty)
    ofed49 = fake_ofed(f"{work}/ofed49", "MLNX_OFED_LINUX-4.9-6.0.6.0", "4.x")
    ofed58 = fake_ofed(f"{work}/ofed58", "MLNX_OFED_LINUX-5.8-1.0.1.1", "5.x")
    partial = fake_ofed(f"{work}/partial", "MLNX_OFED_LINUX-5.8-1.0.1.1", "5.x", partial=True)

    d = detect(empty)
    check(d["found"] == "no", "no OFED markers: not found")
    d = detect(ofed49)
    check(d["found"] == "yes" and d["generation"] == "4.x" and d["version"] == "MLNX_OFED_LINUX-4.9-6.0.6.0",
          "OFED 4.9: found, experimental verbs generation, version from ofed_info")
    check("infiniband/verbs_exp.h" in d["markers"], "OFED 4.9: verbs_exp.h is a marker")
    d = detect(ofed58)
    check(d["found"] == "yes" and d["generation"] == "5.x" and d["pkgconfig"].endswith("usr/lib64/pkgconfig"),
          "OFED 5.8: found, upstream generation, its pkg-config directory")
    d = detect(partial)
    check(d["found"] == "partial" and "libibverbs.pc" in d["reason"], "markers without libraries: partial, says what is missing")
    os.remove(f"{ofed49}/usr/bin/ofed_info")
    d = detect(ofed49)
    check(d["version"] == "MLNX_OFED_LINUX-4.9-6.0.6.0" and d["markers"] == "/etc/infiniband/info,infiniband/verbs_exp.h",
          "without ofed_info the version comes from /etc/infiniband/info")

    rc, out = configure(work, f"-Dofed_root={ofed58}")
    check(rc == 0 and re.search(r"rdma linkage\s*: mofed", out) and "MLNX_OFED_LINUX-5.8-1.0.1.1 (5.x)" in out
      and re.search(r"mlx5dv\s*: False", out),
          "auto with OFED 5.8 chooses mofed, prints its version, and finds no mlx5dv in a tree without it")
    rc, out = configure(work, f"-Dofed_root={ofed49}")
    check(rc == 0 and re.search(r"rdma linkage\s*: mofed", out) and "(4.x)" in out, "auto with OFED 4.9 chooses mofed")
    rc, out = configure(work, f"-Dofed_root={partial}")
    check(rc == 0 and re.search(r"rdma linkage\s*: system", out) and "partial" in out,
          "auto with a partial OFED falls back to system and says why")
    rc, out = configure(work, "-Drdma_link=mofed", f"-Dofed_root={partial}")
    check(rc != 0 and "rdma_link=mofed" in out and "libibverbs.pc" in out, "mofed asked for, partial install: a clear error")
    rc, out = configure(work, "-Drdma_link=mofed", f"-Dofed_root={empty}")
    check(rc != 0 and "no MLNX_OFED marker" in out, "mofed asked for, none installed: a clear error")
    rc, out = configure(work, "-Drdma_link=static")
    check(rc == 0 and "static (providers compiled in: all)" in out, "static prints its providers")

    rc, out = configure(work, "-Drdma_link=source", "-Drdma_core_download=false")
    check(rc != 0 and "-Drdma_core_source=/path/to/rdma-core-44.0.tar.gz" in out and "SHA-256" in out,
          "source without a tarball: the documented error naming what to provide")
    not_rdma = os.path.join(work, "not-rdma-core")
    write(f"{not_rdma}/CMakeLists.txt", "project(something-else)\n")
    rc, out = configure(work, "-Drdma_link=source", f"-Drdma_core_source={not_rdma}")
    check(rc != 0 and "is not an rdma-core source tree" in out, "source pointing at another project: a clear error")
    write(f"{work}/notes.txt", "not a tarball\n")
    rc, out = configure(work, "-Drdma_link=source", f"-Drdma_core_source={work}/notes.txt")
    check(rc != 0 and "neither a directory nor a tarball" in out, "source pointing at a plain file: a clear error")

print(f"linkage: {len(failures)} failed")
sys.exit(1 if failures else 0)
