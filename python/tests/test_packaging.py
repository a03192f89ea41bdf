"""`pip install ./python` needs no registry: the in-tree build backend builds a complete wheel
(every module, METADATA, RECORD with each file's sha256), and pip installs it offline."""
import base64
import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def backend():
    spec = importlib.util.spec_from_file_location(
        "qparity_build_backend", os.path.join(ROOT, "_build", "qparity_build_backend.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class PackagingTest(unittest.TestCase):
    def test_wheel_is_complete_and_recorded(self):
        b = backend()
        self.assertEqual(b.get_requires_for_build_wheel(), [])
        with tempfile.TemporaryDirectory() as d:
            name = b.build_wheel(d)
            with zipfile.ZipFile(os.path.join(d, name)) as z:
                names = set(z.namelist())
                for base, _, files in os.walk(os.path.join(ROOT, "qparity_dump")):
                    for f in files:
                        if f.endswith(".py"):
                            rel = os.path.relpath(os.path.join(base, f), ROOT).replace(os.sep, "/")
                            self.assertIn(rel, names)
                info = [n for n in names if n.endswith(".dist-info/RECORD")][0]
                for line in z.read(info).decode().splitlines():
                    path, digest, size = line.split(",")
                    if not digest:
                        continue
                    data = z.read(path)
                    want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                    self.assertEqual(digest, "sha256=" + want.decode(), path)
                    self.assertEqual(int(size), len(data))
                self.assertIn("Requires-Dist: numpy", z.read(info.replace("RECORD", "METADATA"))
                              .decode())

    def test_pip_installs_offline(self):
        if subprocess.run([sys.executable, "-m", "pip", "--version"],
                          capture_output=True).returncode != 0:
            self.skipTest(f"no pip for {sys.executable}")
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                                "--no-cache-dir", "--target", d, ROOT],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            r = subprocess.run([sys.executable, "-c", "import qparity_dump, sys; "
                                "print(qparity_dump.__file__, qparity_dump.__version__)"],
                               capture_output=True, text=True, cwd=d,
                               env=dict(os.environ, PYTHONPATH=d))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith(d), r.stdout)


if __name__ == "__main__":
    unittest.main()
