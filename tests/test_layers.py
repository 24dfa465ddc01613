"""The library's layers (docs/layers.md): tools/check_layers.py passes on the
tree, and fails on a scratch copy given an upward include, an include cycle
between headers, an include of the CUDA plugin's from below the runtime, a
header named by its bare name, a private header used from another folder or
from a public header, a daemon/ file that includes a library header other
than autocompress.h, or a public header autocompress.h leaves out, so that
the check can fail at all; and the compiler, given a folder's view
(build/inc/<dir>), refuses what the check refuses."""
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
    """A copy of what the check reads: the Makefile, src/, daemon/, tools/."""
    d = tempfile.mkdtemp(prefix="ac-layers-")
    shutil.copy(os.path.join(ROOT, "Makefile"), d)
    for sub in ("src", "daemon", "tools"):
        shutil.copytree(os.path.join(ROOT, sub), os.path.join(d, sub))
    return d


def add_include(root, path, header):
    """Add #include "header" to src/path: before a header's closing #endif,
    at the end of a source file."""
    p = os.path.join(root, path if path.startswith(("daemon/", "tools/")) else "src/" + path)
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
        add_include(d, "core/err.c", "pipeline/job.h")  # core -> pipeline
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
        add_include(d, "core/err.h", "core/tensor.h")
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
        add_include(d, "cuda/ac_cuda.h", "search/search.h")  # not in the Makefile's CUDA_USES
        rc, out = check(d)
        assert rc == 1 and "not in the Makefile's CUDA_USES" in out, out
    finally:
        shutil.rmtree(d)


def test_form_and_private_rules():
    cases = [
        # (file, include, what the check must say)
        ("runtime/eval.c", "model.h", "FORM     src/runtime/eval.c:"),  # bare name of another folder's header
        ("runtime/eval.c", "model.h", 'includes format/model.h by its bare name; write "format/model.h"'),
        ("runtime/eval.c", "format/gguf_int.h", "includes format/gguf_int.h, private to format/"),
        ("format/model.h", "gguf_int.h", "a public header includes the private format/gguf_int.h"),
        ("format/gguf.c", "format/gguf_int.h", 'includes its folder\'s private format/gguf_int.h by a path; write "gguf_int.h"'),
        ("daemon/db.c", "core/err.h", 'FORM     daemon/db.c:'),
        ("daemon/db.c", "core/err.h", 'includes core/err.h; daemon/ and tools/ include "autocompress.h" only'),
        ("tools/remote.c", "job.h", 'includes pipeline/job.h; daemon/ and tools/ include "autocompress.h" only'),
    ]
    for path, inc, want in cases:
        d = scratch()
        try:
            add_include(d, path, inc)
            rc, out = check(d)
            assert rc == 1 and want in out, (path, inc, out)
        finally:
            shutil.rmtree(d)
    # a new public header that autocompress.h does not name
    d = scratch()
    try:
        with open(os.path.join(d, "src", "core", "newthing.h"), "w") as f:
            f.write("#ifndef X\n#define X\n#endif\n")
        rc, out = check(d)
        assert rc == 1 and "src/autocompress.h does not include the public header core/newthing.h" in out, out
        os.rename(os.path.join(d, "src", "core", "newthing.h"), os.path.join(d, "src", "core", "newthing_int.h"))
        rc, out = check(d)
        assert rc == 0, out  # a private one it need not name
    finally:
        shutil.rmtree(d)


def test_fix_rewrites_old_form():
    """--fix turns the old bare includes into the checked form."""
    d = scratch()
    try:
        add_include(d, "runtime/eval.c", "model.h")
        add_include(d, "daemon/db.c", "err.h")
        add_include(d, "daemon/db.c", "job.h")
        rc, _ = check(d)
        assert rc == 1
        p = subprocess.run([sys.executable, CHECK, "--root", d, "--fix"], capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        with open(os.path.join(d, "src", "runtime", "eval.c")) as f:
            assert '#include "format/model.h"' in f.read()
        with open(os.path.join(d, "daemon", "db.c")) as f:
            t = f.read()
        assert '#include "err.h"' not in t and '#include "job.h"' not in t and t.count('#include "autocompress.h"') <= 1
    finally:
        shutil.rmtree(d)


def test_compiler_sees_only_the_view():
    """A folder's compile line (-I build/inc/<dir>) finds the public headers of
    its own and lower folders, not those of higher folders nor private ones."""
    inc = os.path.join(os.environ.get("AC_BUILD", os.path.join(ROOT, "build")), "inc")
    if not os.path.isdir(os.path.join(inc, "core")):
        print("   skip: no %s (make all makes it)" % inc)
        return "skip"
    cc = shutil.which("cc") or shutil.which("gcc")

    def compiles(view, header):
        d = tempfile.mkdtemp(prefix="ac-view-")
        try:
            src = os.path.join(d, "x.c")
            with open(src, "w") as f:
                f.write('#include "%s"\n' % header)
            p = subprocess.run([cc, "-fsyntax-only", "-std=c11", "-D_GNU_SOURCE", "-I", os.path.join(inc, view), src],
                               capture_output=True, text=True)
            return p.returncode == 0
        finally:
            shutil.rmtree(d)
    assert compiles("runtime", "format/model.h")
    assert compiles("runtime", "core/err.h")
    assert not compiles("core", "pipeline/job.h")       # upward
    assert not compiles("runtime", "search/search.h")   # upward
    assert not compiles("pipeline", "format/gguf_int.h")  # private to format
    assert not compiles("public", "format/gguf_int.h")
    assert compiles("public", "autocompress.h")
    assert not compiles("format", "cuda/ac_cuda.h")  # the plugin sits in the runtime's layer


if __name__ == "__main__":
    R = Runner()
    R.run(test_tree_holds)
    R.run(test_upward_include_fails)
    R.run(test_cycle_fails)
    R.run(test_cuda_rules)
    R.run(test_form_and_private_rules)
    R.run(test_fix_rewrites_old_form)
    R.run(test_compiler_sees_only_the_view)
    R.done()
