#!/usr/bin/env python3
"""Compares braid's nccl.h with NVIDIA's, mechanically, through the compiler.

    compare_headers.py REFERENCE_NCCL_H BRAID_NCCL_H [--cc CC] [--not-yet REGEX]

What the reference header declares must be in braid's, the same:
  - every function, by the prototype the compiler reads (gcc -aux-info:
    typedef names as written, parameter names dropped; NCCL's `f()` takes
    braid's `f(void)`);
  - every enumerator's value;
  - every struct's size, and each member's offset;
  - every macro, by name, and where it expands to a constant or an
    initializer, by value (an initializer field by field).
Both headers are read with the same stand-in CUDA headers (cudaStream_t,
cudaEvent_t), so no CUDA toolkit is needed. Prints each difference and
exits 1 if there is any; prints what it compared otherwise. Differences
whose subject matches --not-yet are printed as such and do not count (what
is known not to be built yet); the option fails if it matches none.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

CUDA_STANDIN = """#ifndef BRAID_CUDA_STANDIN
#define BRAID_CUDA_STANDIN
#define CUDART_VERSION 13000
#include <stddef.h>
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
#endif
"""


def run(command, **kwargs):
    return subprocess.run(command, capture_output=True, text=True, **kwargs)


class Reader:
    def __init__(self, cc, work):
        self.cc = cc
        self.work = work
        standin = os.path.join(work, "standin")
        os.makedirs(standin, exist_ok=True)
        for name in ("cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h"):
            with open(os.path.join(standin, name), "w") as f:
                f.write(CUDA_STANDIN)
        self.flags = ["-std=gnu11", "-DNCCL_OS_LINUX", "-I", standin]

    def include_dir(self, header):
        return ["-I", os.path.dirname(os.path.abspath(header))]

    def source(self, name, text):
        path = os.path.join(self.work, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def preprocess(self, header):
        src = self.source("pre.c", "#include <nccl.h>\n")
        out = run([self.cc, "-E", "-P", *self.flags, *self.include_dir(header), src])
        if out.returncode:
            sys.exit(f"cannot preprocess {header}:\n{out.stderr}")
        return out.stdout

    def macros(self, header):
        src = self.source("macros.c", "#include <nccl.h>\n")
        plain = run([self.cc, "-E", "-dM", *self.flags, self.source("empty.c", "")]).stdout
        out = run([self.cc, "-E", "-dM", *self.flags, *self.include_dir(header), src])
        if out.returncode:
            sys.exit(f"cannot list the macros of {header}:\n{out.stderr}")
        before = set(plain.splitlines())
        found = {}
        for line in out.stdout.splitlines():
            if line in before:
                continue
            m = re.match(r"#define (\w+)(\([^)]*\))?(?: (.*))?$", line)
            if m and re.match(r"p?(NCCL|nccl)", m.group(1)) and m.group(1) != "NCCL_H_":
                found[m.group(1)] = (m.group(2), (m.group(3) or "").strip())
        return found

    def prototypes(self, header):
        src = self.source("aux.c", "#include <nccl.h>\n")
        aux = os.path.join(self.work, "aux.txt")
        out = run([self.cc, "-c", "-o", os.devnull, "-aux-info", aux, *self.flags,
                   *self.include_dir(header), src])
        if out.returncode:
            sys.exit(f"cannot read the prototypes of {header}:\n{out.stderr}")
        found = {}
        with open(aux) as f:
            for line in f:
                m = re.match(r"/\*.*?\*/ extern (.*?)\b(p?nccl\w+) \((.*)\);$", line.strip())
                if m:
                    found[m.group(2)] = f"{m.group(1).strip()} ({m.group(3)})"
        return found

    PROBE_HEAD = "#include <nccl.h>\n#include <stddef.h>\n#include <stdio.h>\nint main(void) {\n"

    def probe(self, header, facts):
        """Compiles and runs `facts` ((label, one line of C) each) against
        `header`: one output line per fact, or None and the errors."""
        body = "".join(code + "\n" for _, code in facts)
        src = self.source("probe.c", self.PROBE_HEAD + body + "return 0;\n}\n")
        exe = os.path.join(self.work, "probe")
        out = run([self.cc, "-w", *self.flags, *self.include_dir(header), src, "-o", exe])
        if out.returncode:
            return None, out.stderr
        return run([exe]).stdout.splitlines(), ""

    def probe_each(self, header, facts, problems):
        """probe(), leaving out (as problems) each fact whose line does not
        compile against `header`: the labels kept, and their output."""
        first = self.PROBE_HEAD.count("\n") + 1  # the line of facts[0]
        kept = list(facts)
        while True:
            lines, error = self.probe(header, kept)
            if lines is not None:
                return {label for label, _ in kept}, lines
            bad = {int(n) - first for n in re.findall(r"probe\.c:(\d+):\d+: error", error)}
            bad = {i for i in bad if 0 <= i < len(kept)}
            if not bad:
                sys.exit(f"the probe does not compile against {header}:\n{error}")
            for i in sorted(bad):
                why = re.search(rf"probe\.c:{i + first}:\d+: error: (.*)", error).group(1)
                problems.append(f"{kept[i][0]}: missing ({why})")
            kept = [fact for i, fact in enumerate(kept) if i not in bad]


def top_level(text, keyword):
    """(name, body) of each `typedef <keyword> [tag] { body } name;` in `text`."""
    found = []
    for m in re.finditer(r"typedef\s+" + keyword + r"\b\s*\w*\s*\{", text):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        body = text[m.end():i - 1]
        name = re.match(r"\s*(\w+)\s*;", text[i:])
        if name:
            found.append((name.group(1), body))
    return found


def members(body):
    """The member names of a struct body (nested braces skipped)."""
    names, depth, part = [], 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == ";" and depth == 0:
            part = re.sub(r"\{.*\}", "", part, flags=re.S)
            part = re.sub(r"\[[^\]]*\]", "", part).strip()
            m = re.search(r"\(\s*\*\s*(\w+)\s*\)", part) or re.search(r"(\w+)\s*$", part)
            if m:
                names.append(m.group(1))
            part = ""
        else:
            part += ch
    return names


def enumerators(body):
    return [m.group(1) for m in re.finditer(r"(?:^|,)\s*(\w+)\s*(?==|,|$)", body.strip())]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("reference")
    parser.add_argument("braid")
    parser.add_argument("--cc", default=os.environ.get("CC", "cc"))
    parser.add_argument("--not-yet", default=None, metavar="REGEX",
                        help="differences whose subject matches are listed as not built yet "
                             "and do not fail; it must match at least one")
    args = parser.parse_args()
    problems = []
    with tempfile.TemporaryDirectory() as work:
        reader = Reader(args.cc, work)
        text = reader.preprocess(args.reference)

        ours = reader.prototypes(args.braid)
        theirs = reader.prototypes(args.reference)
        for name, proto in sorted(theirs.items()):
            if name not in ours:
                problems.append(f"function {name}: missing ({proto})")
            elif ours[name] != proto and not proto.endswith("(/* ??? */)"):
                # (An unprototyped `f()` of C is `f(void)` to C++ and to the ABI.)
                problems.append(f"function {name}: {ours[name]}, NCCL's is {proto}")

        enums = [e for _, body in top_level(text, "enum") for e in enumerators(body)]
        structs = [(name, members(body)) for name, body in top_level(text, "struct")]
        ours_macros = reader.macros(args.braid)
        theirs_macros = reader.macros(args.reference)

        # Each fact is a printf of one line; facts braid's header cannot
        # compile are reported one by one, and left out of the comparison.
        facts = []
        for e in enums:
            facts.append((f"enumerator {e}", f'printf("%lld\\n", (long long){e});'))
        for name, fields in structs:
            facts.append((f"sizeof({name})", f'printf("%zu\\n", sizeof({name}));'))
            for field in fields:
                facts.append((f"offsetof({name}, {field})",
                              f'printf("%zu\\n", offsetof({name}, {field}));'))
        for name, (params, value) in sorted(theirs_macros.items()):
            if name not in ours_macros:
                problems.append(f"macro {name}: missing")
                continue
            if params is not None or not value:
                continue
            init = re.match(r"\{\s*sizeof\((\w+)\)", value)
            if init:  # an initializer: the object it makes, member by member
                struct = init.group(1)
                for field in dict(structs).get(struct, []):
                    facts.append((f"macro {name}, .{field}",
                                  f"{{ {struct} v = {name}; const unsigned char* b = "
                                  f"(const unsigned char*)&v.{field}; for (size_t i = 0; "
                                  f'i < sizeof(v.{field}); ++i) printf("%02x", b[i]); '
                                  f'printf("\\n"); }}'))
            elif value.startswith('"'):
                facts.append((f"macro {name}", f'printf("%s\\n", {name});'))
            elif re.search(r"\d\.\d|\df\b", value):
                facts.append((f"macro {name}", f'printf("%g\\n", (double)({name}));'))
            elif value in ("NULL", "((void*)0)") or "void" in value:
                facts.append((f"macro {name}", f'printf("%p\\n", (void*)({name}));'))
            else:
                facts.append((f"macro {name}", f'printf("%lld\\n", (long long)({name}));'))

        reference, error = reader.probe(args.reference, facts)
        if reference is None:
            sys.exit(f"the probe does not compile against {args.reference}:\n{error}")
        kept, lines = reader.probe_each(args.braid, facts, problems)
        reference = [line for (label, _), line in zip(facts, reference) if label in kept]
        kept = [fact for fact in facts if fact[0] in kept]
        for (label, _), mine, nvidia in zip(kept, lines, reference):
            if mine != nvidia:
                problems.append(f"{label}: {mine}, NCCL's is {nvidia}")

        later = []
        if args.not_yet:
            later = [p for p in problems if re.search(args.not_yet, p.split(":")[0])]
            problems = [p for p in problems if p not in later]
            for line in later:
                print(f"not yet: {line}")
            if not later:
                problems.append(f"--not-yet {args.not_yet!r} matches no difference: "
                                "it is there now, drop it")
        for line in problems:
            print(line)
        if problems:
            print(f"{len(problems)} difference(s) from {args.reference}")
            return 1
        print(f"headers agree: {len(theirs)} functions, {len(enums)} enumerators, "
              f"{len(structs)} structs, {len(theirs_macros)} macros"
              + (f"; {len(later)} difference(s) not built yet" if later else ""))
        return 0


if __name__ == "__main__":
    sys.exit(main())
