"""The previous release of feedproc, in a virtualenv of its own, for the rolling-upgrade test.

"The previous release" is the commit before the one that added the newest migration: the newest
code whose schema is one revision older than this checkout's. Its source is exported from git
(`git archive`) and put first on the path of a new virtualenv, whose other packages are this
virtualenv's (the same SQLAlchemy, psycopg and the rest: a release pins none of them), so that
it runs as `OLD/bin/python -m feedproc` in seconds, without a download.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import sysconfig
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from .support import ROOT


@dataclass(frozen=True)
class Release:
    commit: str
    revision: str  # its newest schema revision
    python: Path
    source: Path


def newest_migration() -> Path:
    return max((ROOT / "migrations" / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))


def previous_release(into: Path) -> Release:
    """The previous release, installed under `into`; skips (fails in CI) without git history."""
    newest = newest_migration()
    try:
        added = subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "log",
                "-1",
                "--format=%H",
                "--diff-filter=A",
                "--",
                str(newest.relative_to(ROOT)),
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        added = ""
    if not added:
        if os.environ.get("FEEDPROC_REQUIRE_UPGRADE", "") not in ("", "0"):
            pytest.fail(f"no git history of {newest.name}: the previous release cannot be found")
        pytest.skip(f"no git history of {newest.name} (not a git checkout, or the migration is not committed)")
    commit = f"{added}^"
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True, timeout=60
    ).stdout
    source = into / "source"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(source, filter="data")
    venv = into / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    purelib = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    # The release's own source first; this virtualenv's packages after it (feedproc's among them is
    # this checkout's, found only by a .pth file, which a path listed here does not run).
    (purelib / "previous_release.pth").write_text(f"{source}\n{sysconfig.get_paths()['purelib']}\n")
    revision = max((source / "migrations" / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")).name[:4]
    return Release(commit=added[:12] + "^", revision=revision, python=venv / "bin" / "python", source=source)
