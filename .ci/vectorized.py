"""CI: which of the kernels' hot loops the compiler vectorized, from GCC's
-fopt-info-vec report (a cross build has no hardware to time them on).

    python3 .ci/vectorized.py --cc "aarch64-linux-gnu-gcc -O3 ... -I..." \
        cynorm/_kernels/_convert.c:f32_to_bf16,bf16_to_f32 \
        cynorm/_kernels/layer_norm.c:moments_lanes_f32,cn_store_pass_bf16

Each argument is a generated C file and the functions (the ends of their C
names) that must each hold a loop the report says was vectorized.  The
report gives a loop's file and line (a header's, for loops inlined from
one); the function around that line is found by its definition's line.
Exits 1, naming them, if any function has none.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
from collections import defaultdict

# a function definition's first line: C (static/CN_DRIVER ...) as GCC's
# sources and the headers write them, or Cython's generated definitions
DEFINITION = re.compile(r"^(?:static|CN_DRIVER|CN_ALWAYS_INLINE)\b[^;=]*?\b(\w+)\s*\(")
REPORT = re.compile(r"^(.+?):(\d+):\d+: optimized: loop vectorized")


def definitions(path):
    """The (line, name) of each function definition in path, in order."""
    found = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            m = DEFINITION.match(line)
            if m:
                found.append((i, m.group(1)))
    return found


def enclosing(defs, line):
    name = None
    for start, n in defs:
        if start > line:
            break
        name = n
    return name


def vectorized_functions(cc, source):
    """The names of the functions holding a loop GCC vectorized, compiling
    source with cc."""
    cmd = shlex.split(cc) + ["-c", os.path.basename(source), "-o", os.devnull,
                             "-fopt-info-vec-optimized"]
    run = subprocess.run(cmd, cwd=os.path.dirname(os.path.abspath(source)),
                         capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{run.stderr[-4000:]}")
    where = os.path.dirname(os.path.abspath(source))
    defs = {}
    names = defaultdict(int)
    for line in run.stderr.splitlines():
        m = REPORT.match(line)
        if not m:
            continue
        path = os.path.join(where, m.group(1))
        if path not in defs:
            defs[path] = definitions(path) if os.path.exists(path) else []
        name = enclosing(defs[path], int(m.group(2)))
        if name:
            names[name] += 1
    return names


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cc", required=True, help="the compiler and its flags")
    p.add_argument("wanted", nargs="+", help="FILE.c:func,func,...")
    args = p.parse_args()
    missing = []
    for item in args.wanted:
        source, _, funcs = item.rpartition(":")
        names = vectorized_functions(args.cc, source)
        for want in funcs.split(","):
            # the name ends with want, after a non-letter (Cython prefixes
            # its names: __pyx_f_..._10layer_norm_moments_lanes_f32)
            pattern = re.compile(r"(?<![A-Za-z])" + re.escape(want) + "$")
            hits = sorted(n for n in names if pattern.search(n))
            print(f"{os.path.basename(source)}: {want}: "
                  + (", ".join(hits) if hits else "NO vectorized loop"))
            if not hits:
                missing.append(f"{source}:{want}")
    if missing:
        sys.exit("no vectorized loop in: " + " ".join(missing))


if __name__ == "__main__":
    main()
