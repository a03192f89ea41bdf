#!/usr/bin/env python3
"""Whether two golden-schema dumps hold the same datasets bit for bit.

Usage: dumps_identical.py A.h5 B.h5
Every dataset path of either file must be in both, with the same dtype, shape and bytes; the
files' attributes that say when or by what they were written (`created`, `producer_version`) are not
compared, every other attribute is. Prints the number of datasets compared; exits 1 naming the
first difference.
"""
import sys

import h5py
import numpy as np

IGNORED_ATTRS = {"created", "producer_version", "created_at", "timestamp", "tool_version", "qparity_version",
                 "git_revision", "command_line", "host", "wall_seconds"}


def walk(f):
    out = {}

    def visit(name, obj):
        out[name] = obj

    f.visititems(visit)
    return out


def attrs_of(obj):
    return {k: v for k, v in obj.attrs.items() if k not in IGNORED_ATTRS}


def same_value(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with h5py.File(sys.argv[1], "r") as fa, h5py.File(sys.argv[2], "r") as fb:
        a, b = walk(fa), walk(fb)
        if set(a) != set(b):
            only = sorted(set(a) ^ set(b))
            sys.exit(f"objects in one file only: {only[:5]}")
        n = 0
        for name in sorted(a):
            oa, ob = a[name], b[name]
            if isinstance(oa, h5py.Dataset) != isinstance(ob, h5py.Dataset):
                sys.exit(f"{name}: a dataset in one file, a group in the other")
            if isinstance(oa, h5py.Dataset):
                if not same_value(oa[()], ob[()]):
                    sys.exit(f"{name}: values differ")
                n += 1
            ka, kb = attrs_of(oa), attrs_of(ob)
            if set(ka) != set(kb):
                sys.exit(f"{name}: attributes differ: {sorted(set(ka) ^ set(kb))}")
            for k in ka:
                if not same_value(ka[k], kb[k]):
                    sys.exit(f"{name}: attribute {k} differs")
        for k in set(attrs_of(fa)) | set(attrs_of(fb)):
            if k not in fa.attrs or k not in fb.attrs or not same_value(fa.attrs[k], fb.attrs[k]):
                sys.exit(f"root attribute {k} differs")
    print(f"{n} datasets")


if __name__ == "__main__":
    main()
