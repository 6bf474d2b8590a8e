"""The suite's three folders: ``unit/``, fast tests in one process (``make unit``); ``integration/``, one process end
to end (Trainer runs, the recipes as commands); ``distributed/``, several gloo ranks (its launcher ``launch.py`` and
the scripts it runs, ``workers/``). ``make test`` runs all three.

Every test under ``distributed/`` is marked ``multiprocess`` here (``-m "not multiprocess"`` leaves them out), and a
test marked ``multiprocess`` elsewhere is refused: it belongs there. Tests and workers import the package as
installed; a test imports the helpers of its own folder (pytest puts it on ``sys.path``), and what the tests and the
workers share (the tiny T5, its toy task) is ``hf_flexdemo.testing``."""

from pathlib import Path

import pytest

DISTRIBUTED = Path(__file__).parent / "distributed"


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        if item.path.is_relative_to(DISTRIBUTED):
            item.add_marker(pytest.mark.multiprocess)
        elif item.get_closest_marker("multiprocess"):
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError(f"multi-process tests belong in tests/distributed/: {misplaced}")
