"""One-off relabelling of result rows after the 2026-11-28 rename of the latent DGP's DREG estimators (issue 25).

Until then "dreg" named the estimator that holds the joint draw's ε fixed and keeps the cross terms (today's
ablation "dreg-eps"); since then "dreg" is the conditional form (D.23 through each slot's Gaussian conditional,
first run as "dreg-cond"). This script rewrites, in place and atomically, the rows made with joint draws:

    python benchmarks/ldgp_rename_dreg_rows.py --to-eps FILE...    # "dreg" -> "dreg-eps" (rows made before the rename)
    python benchmarks/ldgp_rename_dreg_rows.py --to-dreg FILE...   # "dreg-cond" -> "dreg" (rows made as dreg-cond)

It renames model names (ldgpL-dreg -> ldgpL-dreg-eps, ldgpL-dreg-cond -> ldgpL-dreg), values of "gradient" and
"train_gradient", and the estimator keys of `benchmarks/ldgp_dreg_bias.py` rows. Rows made before the joint draws
(per-slot draws, where every DREG variant was D.23 itself: the first SNR and quick-preset rows of 2026-11-23,
since removed from docs/results, and docs/results/checks/redesign-equivalence) are not to be passed to it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import tempfile


def rename_value(value: str, mapping: dict) -> str:
    m = re.fullmatch(r"(ldgp\d-)?(dreg(?:-cond)?)", value)
    if m and m.group(2) in mapping:
        return (m.group(1) or "") + mapping[m.group(2)]
    return value


def rename(obj, mapping):
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            new_key = key
            if key in mapping:  # estimator keys of ldgp_dreg_bias rows
                new_key = mapping[key]
            elif key.endswith("_vs_dreg") or key == "cond_vs_dreg":
                # comparisons with the old "dreg": against today's "dreg-eps"
                base = {"d23_vs_dreg": "dreg-d23", "cond_vs_dreg": "dreg"}.get(key, key[: -len("_vs_dreg")])
                new_key = f"{base}_vs_dreg-eps" if "dreg" in mapping and mapping["dreg"] == "dreg-eps" else key
            if key in ("model", "gradient", "train_gradient") and isinstance(value, str):
                value = rename_value(value, mapping)
            out[new_key] = rename(value, mapping)
        return out
    if isinstance(obj, list):
        return [rename(v, mapping) for v in obj]
    return obj


def rewrite(path: str, mapping: dict) -> int:
    with open(path) as f:
        text = f.read()
    changed = 0
    if path.endswith(".jsonl"):
        lines = []
        for line in text.splitlines():
            if line.strip():
                new = json.dumps(rename(json.loads(line), mapping))
                changed += new != json.dumps(json.loads(line))
                lines.append(new)
        out = "\n".join(lines) + "\n"
    else:
        data = json.loads(text)
        new = rename(data, mapping)
        changed = int(new != data)
        second = text.splitlines()[1] if len(text.splitlines()) > 1 else ""
        out = json.dumps(new, indent=len(second) - len(second.lstrip()) or None) + "\n"
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".")
    with os.fdopen(fd, "w") as f:
        f.write(out)
    os.replace(tmp, path)
    return changed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--to-eps", action="store_true", help='"dreg" -> "dreg-eps"')
    g.add_argument("--to-dreg", action="store_true", help='"dreg-cond" -> "dreg"')
    p.add_argument("files", nargs="+")
    a = p.parse_args(argv)
    mapping = {"dreg": "dreg-eps"} if a.to_eps else {"dreg-cond": "dreg"}
    for path in a.files:
        print(path, rewrite(path, mapping), "rows changed")


if __name__ == "__main__":
    main()
