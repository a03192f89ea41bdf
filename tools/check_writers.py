#!/usr/bin/env python3
"""Fails on any C++ file write that does not go through the one atomic writer (issue 50, item 1).

Every output file qparity writes goes through write_file_atomic (core/safetensors/
safetensors_writer.h: a unique temporary, fsync, then a link that never replaces a file unless
asked), or write_golden / write_safetensors / the report writers, which call it. A fixed-name
temporary or a plain std::ofstream can be redirected by a symlink or clobber a user's file.

This scans the C++ sources outside tests/ for the ways a file gets written (std::ofstream,
fopen with a write mode, open / creat with O_CREAT, HDF5 file creation, filesystem copies and
renames). ALLOWED lists each place that may, with the reason; an allowed place that no longer
writes fails too, so the list stays true.

Usage: check_writers.py SOURCE_DIR
"""
import pathlib
import re
import sys

WRITES = re.compile(
    r"std::ofstream|\bofstream\b|\bfopen\s*\(|\bcreat\s*\(|O_CREAT|H5Fcreate|"
    r"copy_file\s*\(|fs::copy\s*\(|std::filesystem::copy\s*\(|\brename\s*\(")

# (path, what the write is) -> why it may write there itself.
ALLOWED = {
    "core/safetensors/safetensors_writer.cpp": "the atomic writer itself (its unique temporary, "
    "O_EXCL, and the link), and the assembler's O_EXCL spill file beside the output",
    "golden/report.cpp": "the report root's lock file (O_CREAT, never output; flock'd while the "
    "index is rebuilt)",
    "golden/golden_file.cpp": "HDF5's in-memory core driver (no file on disk; the image goes "
    "through write_file_atomic)",
    "fuzz/fuzz_tokenizer.cpp": "the fuzz harness's own scratch file",
    "fuzz/fuzz_golden_reader.cpp": "the fuzz harness's own scratch file",
    "examples/downstream/reference_as_engine.cpp": "the stand-in engine copies a checkpoint into "
    "its own --work directory (an example of a user's engine, not qparity)",
}

SCANNED = ("core", "schemes", "reference_cpu", "gpu_engine", "golden", "fixtures", "tools",
           "bench", "fuzz", "examples")


def scan(root: pathlib.Path):
    found = {}
    for top in SCANNED:
        for f in sorted((root / top).rglob("*")):
            if f.suffix not in (".cpp", ".h", ".cu", ".cuh") or not f.is_file():
                continue
            rel = f.relative_to(root).as_posix()
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                code = line.split("//", 1)[0]
                if WRITES.search(code):
                    found.setdefault(rel, []).append((n, line.strip()))
    return found


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    found = scan(root)
    bad = 0
    for rel, hits in found.items():
        if rel in ALLOWED:
            continue
        for n, line in hits:
            print(f"{rel}:{n}: writes a file without write_file_atomic: {line}")
            bad += 1
    for rel in ALLOWED:
        if rel not in found:
            print(f"{rel}: listed in ALLOWED but writes nothing any more: strike it")
            bad += 1
    if bad:
        return 1
    print(f"writers: every file write outside the {len(ALLOWED)} allowed places goes through "
          "write_file_atomic")
    return 0


if __name__ == "__main__":
    sys.exit(main())
