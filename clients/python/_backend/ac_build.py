"""A PEP 517 build backend for autocompress-client, standard library only.

It exists so that ``pip install ./clients/python`` works without the network: with no build requirement, pip's
isolated build environment needs nothing from an index. It builds a pure-Python wheel of the one package (and an
editable wheel that points at the source tree); the project's name, version, summary and Python requirement are read
from pyproject.toml's [project] table.
"""
import base64
import hashlib
import os
import re
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "autocompress_client"


def _project():
    """[project]'s string fields from pyproject.toml (tomllib is 3.11+; the fields read are plain strings)."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    table = re.search(r"^\[project\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M).group(1)
    fields = dict(re.findall(r'^([\w-]+)\s*=\s*"([^"]*)"', table, re.M))
    lic = re.search(r'^license\s*=\s*\{\s*text\s*=\s*"([^"]*)"', table, re.M)
    fields["license"] = lic.group(1) if lic else "UNKNOWN"
    return fields


def _names():
    p = _project()
    return p, re.sub(r"[-_.]+", "_", p["name"]), p["version"]


def _metadata():
    p, _, version = _names()
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\nLicense: %s\nRequires-Python: %s\n"
            "Description-Content-Type: text/markdown\n\n%s" % (p["name"], version, p.get("description", ""),
                                                             p["license"], p.get("requires-python", ">=3.9"), readme))


def _wheel(wheel_directory, files):
    """files: [(archive name, bytes)]; writes the wheel with its dist-info and RECORD, returns its file name."""
    _, dist, version = _names()
    info = "%s-%s.dist-info" % (dist, version)
    files = list(files) + [(info + "/METADATA", _metadata().encode()),
                           (info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: ac_build\nRoot-Is-Purelib: true\n"
                                         b"Tag: py3-none-any\n")]
    record = []
    name = "%s-%s-py3-none-any.whl" % (dist, version)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files:
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
        record.append(info + "/RECORD,,")
        z.writestr(info + "/RECORD", "\n".join(record) + "\n")
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


get_requires_for_build_sdist = get_requires_for_build_editable = get_requires_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = []
    pkg = os.path.join(ROOT, PACKAGE)
    for n in sorted(os.listdir(pkg)):
        if n.endswith(".py") or n == "py.typed":
            with open(os.path.join(pkg, n), "rb") as f:
                files.append(("%s/%s" % (PACKAGE, n), f.read()))
    return _wheel(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel whose .pth file puts this source tree on sys.path."""
    return _wheel(wheel_directory, [("%s.pth" % PACKAGE, (ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    _, dist, version = _names()
    base = "%s-%s" % (dist, version)
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ("pyproject.toml", "README.md", "_backend/ac_build.py", PACKAGE):
            t.add(os.path.join(ROOT, rel), arcname="%s/%s" % (base, rel),
                  filter=lambda ti: None if "__pycache__" in ti.name else ti)
    return name
