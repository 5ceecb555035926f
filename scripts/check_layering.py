#!/usr/bin/env python3
"""The module dependency rule (docs/architecture.md §"The dependency rule"), checked on the
source tree. Exit 1, naming each offending file and line, when:

  - a file outside src/backend/ includes a private CPU backend header ("backend/cpu/...");
    tests/ and bench/ may (they construct a CpuBackend directly);
  - src/model/ computes without the Backend: calls ops:: or matmul(), or includes
    bie/backend/ops.h, matmul.h or thread_pool.h;
  - include/bie/model/model.h mentions ThreadPool or a std::vector<float>& workspace;
  - a kv/ header or source includes an attention/ header (kv stores K/V and hands out its blocks;
    the attention runner in attention/ reads them: kv must not run attention);
  - src/attention/ includes a private kv/ header ("kv/...");
  - backend/ (include/bie/backend/, src/backend/) includes a module above it (kv/, attention/,
    model/, engine/, server/, sampling/, tokenizer/, grammar/, template/): the KV codecs and the
    paged attention it runs live in backend/.

    scripts/check_layering.py [ROOT]"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]')


def files(root, top, exts=(".h", ".cpp")):
    for d, _, names in os.walk(os.path.join(root, top)):
        for n in sorted(names):
            if n.endswith(exts):
                p = os.path.join(d, n)
                yield os.path.relpath(p, root).replace(os.sep, "/"), p


def strip_comments(line):
    return line.split("//", 1)[0]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    errors = []

    def check(rel, path):
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
        for no, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            inc = m.group(1) if m else None
            code = strip_comments(line)
            where = f"{rel}:{no}"
            if inc and inc.startswith("backend/cpu/") and not rel.startswith(
                    ("src/backend/", "tests/", "bench/")):
                errors.append(f"{where}: includes the CPU backend's private {inc} (use bie/backend/backend.h)")
            if rel.startswith("src/model/"):
                if inc in ("bie/backend/ops.h", "bie/backend/matmul.h", "bie/backend/thread_pool.h"):
                    errors.append(f"{where}: model/ includes {inc} (compute through Backend&)")
                if not inc and re.search(r"\bops::|(?<![\w.>])matmul\s*\(", code):
                    errors.append(f"{where}: model/ calls a CPU kernel directly: {line.strip()}")
            if rel == "include/bie/model/model.h" and re.search(
                    r"\bThreadPool\b|std::vector<float>\s*&", code):
                errors.append(f"{where}: model.h names a CPU workspace: {line.strip()}")
            if inc and inc.startswith("bie/attention/"):
                if rel.startswith("include/bie/kv/"):
                    errors.append(f"{where}: a kv/ header includes {inc} (kv must not run attention)")
                if rel.startswith("src/kv/"):
                    errors.append(f"{where}: kv/ includes {inc} (kv must not run attention)")
            if inc and rel.startswith(("include/bie/backend/", "src/backend/")) and re.match(
                    r"(bie/)?(kv|attention|model|engine|server|sampling|tokenizer|grammar|template)/", inc):
                errors.append(f"{where}: backend/ includes {inc}, a module above it")
            if inc and inc.startswith("kv/") and rel.startswith("src/attention/"):
                errors.append(f"{where}: attention/ includes kv's private {inc} (use bie/kv/*.h)")

    for top in ("include", "src", "python"):
        for rel, path in files(root, top):
            check(rel, path)
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} layering violation(s)")
        return 1
    print("layering: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
