#!/usr/bin/env python3
"""Decode the same tokens with two or more bundles of one blueprint on the GPU (synthetic weights,
the same for every bundle of the blueprint) and say whether their logits are equal bit for bit.

Builds that differ only in how kernels are launched, scheduled or fused (PDL, streams, a fusion
rule, an L2 prefetch) must give the same bits; the first bundle is the baseline. Prints one line
per bundle and writes a JSON summary; exits 1 when a bundle differs from the baseline.
Usage: scripts/compare_logits.py BASE.kbp OTHER.kbp... --trust KEYS.pub.json [--positions N]"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundles", nargs="+", type=Path)
    ap.add_argument("--trust", type=Path, required=True)
    ap.add_argument("--positions", type=int, default=16)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    from kbpc.bundle.keys import Keyring
    from kbpc.testing.decode import decode_logits, differing_positions

    trust = Keyring.load(args.trust)
    base = decode_logits(args.bundles[0], trust, args.positions)
    report, rc = {"baseline": str(args.bundles[0]), "positions": args.positions, "bundles": {}}, 0
    for path in args.bundles[1:]:
        differ = differing_positions(base, decode_logits(path, trust, args.positions))
        report["bundles"][str(path)] = {"equal": not differ, "positions_that_differ": differ}
        print(f"{path}: {'bit-equal' if not differ else f'DIFFERS at positions {differ}'} over {args.positions} positions")
        rc |= bool(differ)
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
