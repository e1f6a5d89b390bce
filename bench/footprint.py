#!/usr/bin/env python3
"""footprint.py - the code a call runs: the distinct instructions that a callgrind
profile (valgrind --tool=callgrind --dump-instr=yes) shows run at least once per call,
per object file and per function.

  footprint.py PROFILE CALLS [FUNCTIONS (25)] [LEAVE_OUT]

LEAVE_OUT: a regular expression of functions not to count (a benchmark's summary: its
sort of the calls' latencies runs n log n times, more than once per call).

Why count this, not instructions: under QEMU's TCG, code a vCPU has not run lately
costs far more than its instructions (bench/results/rpc-round-trip.md: 256 distinct
small functions cost a round trip 19 us where 256 calls of one cost 4.4), so what a
round trip pays for is the number of distinct instructions it runs, each side. Unlike
a time on this host, the count repeats to the instruction from run to run.

An instruction run at least 0.9 x CALLS times is counted: a call's path runs once per
call (a few calls skip a part: the last starts no next one), setup and teardown run
once or in loops shorter than CALLS. The dynamic linker is left out: its symbol lookups run
thousands of times at startup, never on a call's path once bound.
"""
import collections
import re
import sys

COMPRESSED = re.compile(r'\((\d+)\)(?: (.*))?$')
# the name-compressed specifications and which table each uses
TABLES = {'ob': 'ob', 'cob': 'ob', 'fn': 'fn', 'cfn': 'fn', 'fl': 'fl', 'fi': 'fl', 'fe': 'fl', 'cfi': 'fl',
          'cfl': 'fl'}


def position(text, last):
    """One position of a cost line: absolute (hex or decimal), relative (+N, -N) or '*'."""
    if text == '*':
        return last
    if text[0] in '+-':
        return last + int(text, 0)
    return int(text, 0)


def read(path):
    """Per (object, function, instruction address): the instructions' count (Ir)."""
    names = {'ob': {}, 'fn': {}, 'fl': {}}
    counts = collections.Counter()
    obj = fn = '?'
    spec = []
    last = []
    call_line = False  # the cost line after calls= is the call's inclusive cost
    with open(path) as f:
        for line in f:
            line = line.rstrip('\n')
            if not line or line[0] == '#':
                continue
            if line.startswith('positions:'):
                spec = line.split()[1:]
                last = [0] * len(spec)
                continue
            if line[0].isalpha():
                key, _, value = line.partition('=')
                if key in TABLES:
                    m = COMPRESSED.match(value)
                    table = names[TABLES[key]]
                    if m:
                        if m.group(2) is not None:
                            table[m.group(1)] = m.group(2)
                        value = table.get(m.group(1), '?')
                    if key == 'ob':
                        obj = value
                    elif key == 'fn':
                        fn = value
                elif key == 'calls':
                    call_line = True
                continue
            if line[0] not in '0123456789+-*':
                continue
            fields = line.split()
            for i in range(len(spec)):
                last[i] = position(fields[i], last[i])
            if call_line:
                call_line = False
                continue
            ir = int(fields[len(spec)]) if len(fields) > len(spec) else 0
            counts[(obj, fn, last[0])] += ir
    return counts


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    counts = read(sys.argv[1])
    calls = int(sys.argv[2])
    shown = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    leave_out = re.compile(sys.argv[4]) if len(sys.argv) > 4 else None
    by_object = collections.Counter()
    by_function = collections.Counter()
    for (obj, fn, _), ir in counts.items():
        obj = obj.rsplit('/', 1)[-1]
        if ir < 0.9 * calls or obj.startswith('ld-linux') or (leave_out and leave_out.search(fn)):
            continue
        by_object[obj] += 1
        by_function[(obj, fn)] += 1
    print(f'distinct instructions run once per call: {sum(by_object.values())}')
    for obj, n in by_object.most_common():
        print(f'{n:7d}  {obj}')
    print(f'the {shown} functions with the most:')
    for (obj, fn), n in by_function.most_common(shown):
        fn = re.sub(r'\(.*', '', fn)  # the name, without its parameters
        print(f'{n:7d}  {obj}: {fn[-100:]}')


if __name__ == '__main__':
    main()
