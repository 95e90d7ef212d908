"""The daemon runs the garbage collector less often while consuming, and restores it."""

from __future__ import annotations

import gc

from ingest.pipeline import app


def test_collector_is_tuned_while_consuming_and_restored_after() -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    with app._fewer_collections():
        assert gc.get_threshold() == (app.GC_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > frozen  # start-up objects are not walked again
        assert gc.isenabled()  # cyclic garbage is still collected
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen
