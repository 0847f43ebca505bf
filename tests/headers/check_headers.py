"""Compiles each public header on its own, as a consumer's first include, under the
strictest warnings a consumer may build with (-Werror): every header must be
self-contained and warning-free with g++ and with clang++.

usage: check_headers.py INCLUDE_DIR [--json-include DIR] COMPILER...

Each COMPILER is a path to g++ or clang++; g++ adds -Wuseless-cast, clang++ adds
-Wdocumentation. The CUDA-only files (cuda/*.cuh) are not headers a host compiler
sees; cuda/scan.hpp is, and is checked. json.hpp needs nlohmann-json:
from --json-include (as -isystem, so its own warnings stay its own) or the compiler's
default paths; where neither has it, json.hpp is reported skipped, not passed.

One translation unit per header and compiler, -fsyntax-only, as many at once as there
are CPUs. By default only the first COMPILER is run (the README's test command, a
minute less on two cores); MASKLENS_HEADERS_ALL_COMPILERS=1 runs every one (CI does).
The heaviest include, nlohmann/json.hpp, is parsed only in json.hpp's own unit: where
it is missing, that unit's error says so and json.hpp is reported skipped."""
import concurrent.futures
import os
import subprocess
import sys
import tempfile

COMMON = ["-std=c++20", "-Wall", "-Wextra", "-Wpedantic", "-Wconversion", "-Wsign-conversion", "-Wshadow",
          "-Wold-style-cast", "-Werror", "-fsyntax-only"]
# A warning each flag set must turn into an error: proves the flags reach the compiler
# (a wrapper that dropped them would let every header pass).
CANARY = "unsigned f(int i) { return i; }\nint g(long l) { return (int)l; }\n"


def flags(compiler):
    out = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    return COMMON + (["-Wdocumentation"] if "clang" in out else ["-Wuseless-cast"])


def compile_source(compiler, extra, source, workdir):
    fd, path = tempfile.mkstemp(suffix=".cpp", dir=workdir)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    p = subprocess.run([compiler, *extra, path], capture_output=True, text=True)
    return p.returncode, (p.stdout + p.stderr).replace(path, "<tu>")


def missing_json(output):
    """Whether a compiler's errors say nlohmann/json.hpp was not found (g++: "No such file
    or directory", clang++: "file not found"), and nothing else went wrong first."""
    first = next((line for line in output.splitlines() if "error" in line), "")
    return "nlohmann/json.hpp" in first and ("No such file" in first or "not found" in first)


def main():
    args = sys.argv[1:]
    include = os.path.abspath(args.pop(0))
    json_include = None
    if args and args[0] == "--json-include":
        args.pop(0)
        json_include = args.pop(0) or None
    compilers = args
    if not compilers:
        print("no compiler given")
        return 77
    if os.environ.get("MASKLENS_HEADERS_ALL_COMPILERS", "") != "1":
        if len(compilers) > 1:
            print(f"checking with {compilers[0]} only (MASKLENS_HEADERS_ALL_COMPILERS=1: also {', '.join(compilers[1:])})")
        compilers = compilers[:1]

    headers = sorted(os.path.relpath(os.path.join(root, name), include)
                     for root, _, names in os.walk(os.path.join(include, "masklens"))
                     for name in names if name.endswith(".hpp"))
    if "masklens/masklens.hpp" not in headers or "masklens/cuda/scan.hpp" not in headers:
        print(f"headers not found under {include}")
        return 1

    failures, skipped, passed = [], [], 0
    with tempfile.TemporaryDirectory() as work, concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        jobs = {}
        for compiler in compilers:
            base = flags(compiler) + ["-I" + include]
            rc, out = compile_source(compiler, base, CANARY, work)
            if rc == 0:
                failures.append(f"{compiler}: the canary's conversions compiled without an error: flags not applied")
            json_flags = list(base)
            if json_include and os.path.realpath(json_include) not in ("/usr/include", "/usr/local/include"):
                json_flags.append("-isystem" + json_include)
            for header in headers:
                extra = json_flags if header == "masklens/json.hpp" else base
                jobs[pool.submit(compile_source, compiler, extra, f"#include <{header}>\n", work)] = (compiler, header)
        for job in concurrent.futures.as_completed(jobs):
            compiler, header = jobs[job]
            rc, out = job.result()
            if rc != 0 and header == "masklens/json.hpp" and missing_json(out):
                skipped.append(f"{compiler} {header} (nlohmann/json.hpp not found)")
            elif rc != 0:
                failures.append(f"{compiler} {header}:\n{out}")
            else:
                passed += 1

    for s in skipped:
        print("skipped:", s)
    for f in failures:
        print("FAILED:", f)
    print(f"{passed} header compilations clean ({len(headers)} headers x {len(compilers)} compiler"
          f"{'s' if len(compilers) > 1 else ''}), "
          f"{len(skipped)} skipped, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
