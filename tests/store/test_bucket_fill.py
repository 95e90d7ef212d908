"""``loadgen bucket-fill``: bucket-mode write time against document fill, the real command."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.procs import ROOT


def test_bucket_fill_reports_every_band_of_fill_up_to_the_cap(mongo_uri: str, db_name: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadgen",
            "bucket-fill",
            "--mongodb-uri",
            mongo_uri,
            "--db",
            db_name,
            "--cap",
            "20",
            "--sensors",
            "2",
            "--bands",
            "4",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    bands = json.loads(result.stdout)
    assert [(b["low"], b["high"], b["writes"]) for b in bands] == [
        (0, 5, 10),
        (5, 10, 10),
        (10, 15, 10),
        (15, 20, 10),
    ]
    assert all(0 < b["median_ms"] <= b["p90_ms"] for b in bands)
