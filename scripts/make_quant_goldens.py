#!/usr/bin/env python3
"""Generate the golden dequantisation hashes of tests/test_quant.cpp (QuantGolden.*).

For each weight type: the same pseudo-random blocks the test builds (SplitMix64 bytes seeded by
0x1234 + the ggml type id, fp16 scale fields replaced by finite values, F16/BF16 inf/NaN patterns
cleared), dequantised by gguf-py (gguf.quants.dequantize, a numpy port of ggml's dequantisers,
independent of BIE's C++), and the FNV-1a 64 hash of the float32 output bytes.

    python3 -m venv /tmp/venv-gguf && /tmp/venv-gguf/bin/pip install gguf==0.19.0 numpy
    /tmp/venv-gguf/bin/python scripts/make_quant_goldens.py            # prints the C++ table
    /tmp/venv-gguf/bin/python scripts/make_quant_goldens.py --check    # compares with the test

--check exits 1 when a hash in tests/test_quant.cpp differs from the one computed here.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

import numpy as np

try:
    from gguf import GGMLQuantizationType as Q
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.quants import dequantize
except ImportError:  # pragma: no cover
    sys.exit("make_quant_goldens: `pip install gguf==0.19.0 numpy` first")

MASK64 = (1 << 64) - 1

# (type, byte offsets of the fp16 fields inside one block), in the test's order.
SPECS = [
    (Q.F16, []), (Q.BF16, []),
    (Q.Q4_0, [0]), (Q.Q4_1, [0, 2]), (Q.Q5_0, [0]), (Q.Q5_1, [0, 2]), (Q.Q8_0, [0]),
    (Q.Q2_K, [80, 82]), (Q.Q3_K, [108]), (Q.Q4_K, [0, 2]), (Q.Q5_K, [0, 2]), (Q.Q6_K, [208]),
]


class SplitMix64:
    def __init__(self, seed: int):
        self.x = seed & MASK64

    def next(self) -> int:
        self.x = (self.x + 0x9E3779B97F4A7C15) & MASK64
        z = self.x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def golden_blocks(qtype: Q, half_offsets: list[int]) -> bytearray:
    """The bytes tests/test_quant.cpp's golden_blocks() builds for this type."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    del block_size
    n_blocks = 64 if type_size == 2 else 8
    r = SplitMix64(0x1234 + int(qtype))
    data = bytearray(r.next() & 0xFF for _ in range(type_size * n_blocks))
    for i in range(n_blocks):
        for o in half_offsets:
            v = r.next()
            h = (0x1C00 + v % 0x1000) | (0x8000 if (v >> 20) & 1 else 0)
            data[i * type_size + o] = h & 0xFF
            data[i * type_size + o + 1] = h >> 8
    if qtype in (Q.F16, Q.BF16):
        for i in range(n_blocks):
            hi = data[2 * i + 1]
            if qtype == Q.F16 and (hi & 0x7C) == 0x7C:
                hi &= 0xBF
            if qtype == Q.BF16 and (hi & 0x7F) == 0x7F and (data[2 * i] & 0x80):
                hi &= 0xBF
            data[2 * i + 1] = hi
    return data


def golden_hash(qtype: Q, half_offsets: list[int]) -> int:
    raw = np.frombuffer(bytes(golden_blocks(qtype, half_offsets)), dtype=np.uint8)
    y = dequantize(raw, qtype).astype(np.float32, copy=False)
    return fnv1a(np.ascontiguousarray(y).tobytes())


def committed_hashes(path: str) -> dict[str, int]:
    text = open(path, encoding="utf-8").read()
    return {m.group(1): int(m.group(2), 16)
            for m in re.finditer(r"\{G::(\w+), \{[\d, ]*\}, 0x([0-9a-f]+)ull\}", text)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with tests/test_quant.cpp")
    ap.add_argument("--test-file", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                        "..", "tests", "test_quant.cpp"))
    args = ap.parse_args()
    computed = {q.name: golden_hash(q, offs) for q, offs in SPECS}
    for q, offs in SPECS:
        print(f"{{G::{q.name}, {{{', '.join(map(str, offs))}}}, 0x{computed[q.name]:016x}ull}},")
    if not args.check:
        return 0
    committed = committed_hashes(args.test_file)
    bad = [n for n in computed if committed.get(n) != computed[n]]
    for n in bad:
        have = committed.get(n)
        print(f"make_quant_goldens: {n}: test has {'none' if have is None else f'0x{have:016x}'}, "
              f"gguf-py gives 0x{computed[n]:016x}", file=sys.stderr)
    print(f"make_quant_goldens: {len(computed) - len(bad)}/{len(computed)} hashes in "
          f"{os.path.relpath(args.test_file)} reproduced", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
