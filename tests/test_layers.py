"""The library's layers (docs/layers.md): tools/check_layers.py passes on the
tree, and fails on a scratch copy given an upward include, an include cycle
between headers, or an include of the CUDA plugin's from below the runtime,
so that the check can fail at all."""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, Runner  # noqa: E402

CHECK = os.path.join(ROOT, "tools", "check_layers.py")


def check(root):
    p = subprocess.run([sys.executable, CHECK, "--root", root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def scratch():
    """A copy of what the check reads: the Makefile and src/."""
    d = tempfile.mkdtemp(prefix="ac-layers-")
    shutil.copy(os.path.join(ROOT, "Makefile"), d)
    shutil.copytree(os.path.join(ROOT, "src"), os.path.join(d, "src"))
    return d


def add_include(root, path, header):
    """Add #include "header" to src/path: before a header's closing #endif,
    at the end of a source file."""
    p = os.path.join(root, "src", path)
    with open(p) as f:
        text = f.read()
    inc = '#include "%s"\n' % header
    i = text.rfind("#endif")
    text = text[:i] + inc + text[i:] if path.endswith(".h") and i >= 0 else text + inc
    with open(p, "w") as f:
        f.write(text)


def test_tree_holds():
    rc, out = check(ROOT)
    print("   " + out.strip().split("\n")[-1])
    assert rc == 0, out


def test_upward_include_fails():
    d = scratch()
    try:
        add_include(d, "core/err.c", "job.h")  # core -> pipeline
        rc, out = check(d)
        assert rc == 1 and "includes pipeline/job.h (pipeline is above core)" in out and "UPWARD   src/core/err.c:" in out, out
        # a header of a higher folder named by its folder path, from a header
        add_include(d, "format/model.h", "search/search.h")
        rc, out = check(d)
        assert rc == 1 and "UPWARD   src/format/model.h:" in out and "includes search/search.h" in out, out
    finally:
        shutil.rmtree(d)


def test_cycle_fails():
    d = scratch()
    try:
        # err.h <- tensor.h already; err.h -> tensor.h closes a circle in core
        add_include(d, "core/err.h", "tensor.h")
        rc, out = check(d)
        assert rc == 1 and "CYCLE" in out and "src/core/err.h" in out, out
    finally:
        shutil.rmtree(d)


def test_cuda_rules():
    d = scratch()
    try:
        add_include(d, "format/model.c", "cuda/ac_cuda.h")  # format is below the plugin
        rc, out = check(d)
        assert rc == 1 and "UPWARD   src/format/model.c:" in out and "includes cuda/ac_cuda.h" in out, out
    finally:
        shutil.rmtree(d)
    d = scratch()
    try:
        add_include(d, "cuda/ac_cuda.h", "search.h")  # not in src/cuda/Makefile's INC
        rc, out = check(d)
        assert rc == 1 and "not in src/cuda/Makefile's INC" in out, out
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    R = Runner()
    R.run(test_tree_holds)
    R.run(test_upward_include_fails)
    R.run(test_cycle_fails)
    R.run(test_cuda_rules)
    R.done()
