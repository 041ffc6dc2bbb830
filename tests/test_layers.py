"""The package's layers, enforced: the import-linter contracts in pyproject.toml
([tool.importlinter]) hold, and a contract of that kind does catch an upward import or a
cycle (checked on a small package written here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _lint(config: Path, root: Path) -> int:
    """Run import-linter in this process. It configures logging with dictConfig, which
    disables every logger that exists (fedgmr's among them): the logging state is put back
    afterwards, so that later tests in this worker still see fedgmr's warnings."""
    import logging
    import os

    from importlinter.cli import lint_imports

    loggers = {name: (lg, lg.disabled, lg.level, lg.propagate, list(lg.handlers))
               for name, lg in logging.root.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    root_state = (logging.root.level, list(logging.root.handlers))
    old_path, old_cwd = list(sys.path), Path.cwd()
    sys.path.insert(0, str(root))
    try:
        os.chdir(root)
        return lint_imports(config_filename=str(config), no_cache=True)
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path
        for lg, disabled, level, propagate, handlers in loggers.values():
            lg.disabled, lg.level, lg.propagate = disabled, level, propagate
            lg.handlers[:] = handlers
        logging.root.setLevel(root_state[0])
        logging.root.handlers[:] = root_state[1]


def test_linting_leaves_the_logging_of_this_process_as_it_was():
    import logging

    log = logging.getLogger("fedgmr.strategy.masked_buffered")
    assert _lint(REPO / "pyproject.toml", REPO) == 0
    assert not log.disabled and log.isEnabledFor(logging.WARNING)


def test_the_repository_keeps_its_import_contracts():
    assert _lint(REPO / "pyproject.toml", REPO) == 0


@pytest.mark.parametrize("body, kept", [("", 0), ("from toypkg import top\n", 1)])
def test_an_upward_import_or_a_cycle_breaks_the_contracts(tmp_path: Path, body: str, kept: int):
    pkg = tmp_path / "toypkg"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "math.py").write_text(body)       # the core reaching up to the top: forbidden, and a cycle
    (pkg / "top.py").write_text("from toypkg.core import math\n")
    config = tmp_path / "contracts.toml"
    config.write_text("""[tool.importlinter]
root_package = "toypkg"

[[tool.importlinter.contracts]]
name = "the core imports nothing above it"
type = "forbidden"
source_modules = ["toypkg.core"]
forbidden_modules = ["toypkg.top"]

[[tool.importlinter.contracts]]
name = "no cycles"
type = "acyclic_siblings"
ancestors = ["toypkg"]
""")
    sys.modules.pop("toypkg", None)
    assert _lint(config, tmp_path) == kept  # 0: kept; 1: broken
