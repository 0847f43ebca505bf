"""The Python package's tests from `meson test` (suite python): runs pytest on
tests/python against the build tree (argument 1, build/python) or the installed
package. Exit 77 (skipped) where torch, pytest or the package cannot be imported."""
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
build = sys.argv[1] if len(sys.argv) > 1 else None
env = dict(os.environ)
if build:
    env["MASKLENS_PYTHONPATH"] = build
    sys.path.insert(0, build)
try:
    import pytest  # noqa: F401
    import torch  # noqa: F401
    import masklens._core  # noqa: F401
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", here], env=env, cwd=here)
# pytest's 5 is "no tests ran": a failure here, not a skip.
sys.exit(1 if r.returncode == 5 else r.returncode)
