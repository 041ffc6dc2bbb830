"""The wheel a user installs carries the licence pyproject.toml declares."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_declared_licence_files_exist_and_match_the_expression():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    for name in project["license-files"]:
        text = (ROOT / name).read_text()
        assert "Apache License" in text and "Version 2.0, January 2004" in text
        assert "END OF TERMS AND CONDITIONS" in text


def test_built_wheel_ships_the_licence(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         str(ROOT), "--wheel-dir", str(tmp_path)],
        check=True, timeout=600,
    )
    (wheel,) = tmp_path.glob("fedgmr-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
        shipped = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
        assert archive.read(shipped) == (ROOT / "LICENSE").read_bytes()
    assert "License-Expression: Apache-2.0" in lines
    assert "License-File: LICENSE" in lines
