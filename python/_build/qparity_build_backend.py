"""A PEP 517 build backend for qparity-dump that needs nothing beyond the standard library.

`pip install ./python` on a machine without registry access would fail with setuptools as the
backend (pip fetches build requirements into an isolated environment); this backend builds the
pure-Python wheel itself: the package files, METADATA, WHEEL and RECORD (sha256 of every file).
"""
import base64
import hashlib
import os
import tarfile
import zipfile

NAME = "qparity_dump"
DIST = "qparity_dump"
VERSION = "0.1.0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METADATA = f"""Metadata-Version: 2.1
Name: qparity-dump
Version: {VERSION}
Summary: Dump a PyTorch engine's activations as a qparity candidate (golden schema v1)
Requires-Python: >=3.9
Requires-Dist: numpy
Provides-Extra: h5py
Requires-Dist: h5py; extra == "h5py"
Provides-Extra: torch
Requires-Dist: torch; extra == "torch"
"""
WHEEL = """Wheel-Version: 1.0
Generator: qparity_build_backend
Root-Is-Purelib: true
Tag: py3-none-any
"""


def _package_files():
    out = []
    for base, dirs, files in os.walk(os.path.join(ROOT, NAME)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                full = os.path.join(base, f)
                out.append((full, os.path.relpath(full, ROOT).replace(os.sep, "/")))
    return out


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory, editable=False):
    info = f"{DIST}-{VERSION}.dist-info"
    path = os.path.join(wheel_directory, f"{DIST}-{VERSION}-py3-none-any.whl")
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        def add(arcname, data):
            z.writestr(arcname, data)
            record.append(_record_line(arcname, data))
        if editable:  # a .pth file pointing at this tree
            add(f"{DIST}.pth", (ROOT + "\n").encode())
        else:
            for full, arcname in _package_files():
                with open(full, "rb") as f:
                    add(arcname, f.read())
        add(f"{info}/METADATA", METADATA.encode())
        add(f"{info}/WHEEL", WHEEL.encode())
        record.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return os.path.basename(path)


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, editable=True)


def build_sdist(sdist_directory, config_settings=None):
    name = f"{DIST}-{VERSION}"
    path = os.path.join(sdist_directory, name + ".tar.gz")
    with tarfile.open(path, "w:gz") as t:
        for rel in ["pyproject.toml", "_build/qparity_build_backend.py"]:
            t.add(os.path.join(ROOT, rel), arcname=f"{name}/{rel}")
        for full, arcname in _package_files():
            t.add(full, arcname=f"{name}/{arcname}")
        pkg_info = os.path.join(sdist_directory, "PKG-INFO.tmp")
        with open(pkg_info, "w") as f:
            f.write(METADATA)
        t.add(pkg_info, arcname=f"{name}/PKG-INFO")
        os.remove(pkg_info)
    return os.path.basename(path)
