"""The README's candidate example is python/examples/candidate_from_arrays.py, verbatim and
under 20 lines (the C++ integration test runs the file against a real golden)."""
import os
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ReadmeExampleTest(unittest.TestCase):
    def test_readme_shows_the_tested_example(self):
        with open(os.path.join(ROOT, "python", "examples", "candidate_from_arrays.py")) as f:
            code = f.read()
        body = code[code.index("import sys"):]
        self.assertLess(len([l for l in body.splitlines() if l.strip()]), 20)
        for doc in ("README.md", os.path.join("golden", "SCHEMA.md")):
            with open(os.path.join(ROOT, doc)) as f:
                self.assertIn(body, f.read(), f"{doc} must show the example verbatim")


if __name__ == "__main__":
    unittest.main()
