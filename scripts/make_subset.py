#!/usr/bin/env python3
"""Writes the Fashion-MNIST subset embedded in qcandle (`data/` at the repository root).

Takes the first 6000 training and the first 1000 test images and labels from the
Fashion-MNIST IDX files (default: /usr/share/datasets/fashion-mnist, Debian package
`dataset-fashion-mnist`) and writes them as IDX files, gzip-compressed with level 9 and
mtime 0 and no file name in the header, so the output is reproducible. Python 3 stdlib only.

Usage: python3 scripts/make_subset.py [SOURCE_DIR] [OUT_DIR]
"""

import gzip
import hashlib
import os
import struct
import sys

TRAIN, TEST = 6000, 1000
IMAGES, LABELS = 0x00000803, 0x00000801


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    (magic,) = struct.unpack(">I", raw[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, raw[4 : 4 + 4 * ndim])
    return magic, dims, raw[4 + 4 * ndim :]


def write_subset(src, dst, n):
    magic, dims, body = read_idx(src)
    if magic not in (IMAGES, LABELS):
        sys.exit(f"{src}: unexpected magic {magic:#010x}")
    per_item = 1
    for d in dims[1:]:
        per_item *= d
    if dims[0] < n or len(body) != dims[0] * per_item:
        sys.exit(f"{src}: {dims[0]} items, need {n}")
    new_dims = (n,) + tuple(dims[1:])
    raw = struct.pack(">I", magic) + struct.pack(">" + "I" * len(new_dims), *new_dims)
    raw += body[: n * per_item]
    packed = gzip.compress(raw, compresslevel=9, mtime=0)
    with open(dst, "wb") as f:
        f.write(packed)
    print(
        f"{os.path.basename(dst)}  {len(packed)} bytes  "
        f"sha256 {hashlib.sha256(packed).hexdigest()}  "
        f"decompressed {len(raw)} bytes sha256 {hashlib.sha256(raw).hexdigest()}"
    )


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/datasets/fashion-mnist"
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "data"
    )
    os.makedirs(out, exist_ok=True)
    for split, n in (("train", TRAIN), ("t10k", TEST)):
        for kind, rank in (("images", 3), ("labels", 1)):
            name = f"{split}-{kind}-idx{rank}-ubyte.gz"
            write_subset(os.path.join(src, name), os.path.join(out, name), n)


if __name__ == "__main__":
    main()
