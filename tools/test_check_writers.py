#!/usr/bin/env python3
"""check_writers.py on planted trees: a stray std::ofstream fails naming its file and line, the
allowed writers pass, and an allowed place that stopped writing fails too."""
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import check_writers  # noqa: E402


def run(root):
    p = subprocess.run([sys.executable, str(HERE / "check_writers.py"), str(root)],
                       capture_output=True, text=True)
    return p.returncode, p.stdout


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        for rel in check_writers.ALLOWED:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text('int f() { return ::open("x", O_CREAT); }\n')
        rc, out = run(root)
        assert rc == 0, out
        stray = root / "golden" / "stray.cpp"
        stray.write_text('#include <fstream>\n// std::ofstream in a comment is fine\n'
                         'void g() { std::ofstream("out.txt") << 1; }\n')
        rc, out = run(root)
        assert rc == 1 and "golden/stray.cpp:3:" in out, out
        stray.unlink()
        (root / "fuzz" / "fuzz_tokenizer.cpp").write_text("int f() { return 0; }\n")
        rc, out = run(root)
        assert rc == 1 and "fuzz/fuzz_tokenizer.cpp" in out and "strike it" in out, out
    print("check_writers: planted trees judged as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
