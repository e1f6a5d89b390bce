#!/usr/bin/env python3
"""Counts test cases in meson test logs (testlog JSON) and prints one line per test
program and the total "N passed, N failed, N skipped".

A doctest program is counted by its own summary line; a program that exited with a
failure its test cases did not report (a leak check, a crash) adds one failure; a
program that skipped as a whole (exit 77) counts one skip. A missing log is a failure:
the suite did not run.

  summarize.py LOG.json... [--totals FILE]   (FILE gets "passed failed skipped")
"""
import json
import re
import sys

DOCTEST = re.compile(r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed\s*\|\s*(\d+) skipped")


def count(entry):
    result = entry.get("result", "")
    output = entry.get("stdout", "") or ""
    if result == "SKIP":
        return 0, 0, 1
    lines = DOCTEST.findall(output)
    if not lines:
        return (1, 0, 0) if result == "OK" else (0, 1, 0)
    _, passed, failed, skipped = map(int, lines[-1])
    if result != "OK" and failed == 0:
        failed = 1
    return passed, failed, skipped


def main(argv):
    totals_file = None
    if "--totals" in argv:
        i = argv.index("--totals")
        totals_file = argv[i + 1]
        del argv[i:i + 2]
    total = [0, 0, 0]
    for path in argv:
        try:
            with open(path) as f:
                entries = [json.loads(line) for line in f if line.strip()]
        except OSError:
            print(f"{path}: missing: that suite did not run")
            total[1] += 1
            continue
        for entry in entries:
            p, f, s = count(entry)
            total = [total[0] + p, total[1] + f, total[2] + s]
            where = re.search(r"device suite on (\S+)", entry.get("stdout", "") or "")
            note = f" (ran on {where.group(1)})" if where else ""
            print(f"{entry['name']}: {entry.get('result')}: {p} passed, {f} failed, {s} skipped{note}")
    if totals_file:
        with open(totals_file, "w") as f:
            f.write(" ".join(map(str, total)) + "\n")
    print(f"{total[0]} passed, {total[1]} failed, {total[2]} skipped")
    return 1 if total[1] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
