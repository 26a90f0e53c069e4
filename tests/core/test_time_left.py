"""TimeLeft: the one estimate of a job's time left, said by the CLI's progress lines and the panels' bars."""
from __future__ import annotations

import pytest

from desktop_app.core.jobs import TimeLeft


@pytest.mark.parametrize("elapsed,done,total,said", [
    (2.0, 10, 40, "about 6 s left"),          # 5 units/s, 30 to go
    (60.0, 10, 40, "about 3.0 min left"),     # 180 s
    (3600.0, 10, 40, "about 3.0 h left"),     # 10,800 s
    (5.0, 0, 40, ""),                         # no rate yet
    (5.0, 40, 40, ""),                        # done
])
def test_time_left_from_the_rate_so_far(monkeypatch, elapsed, done, total, said):
    now = [100.0]
    monkeypatch.setattr(TimeLeft, "clock", staticmethod(lambda: now[0]))
    t = TimeLeft()
    now[0] += elapsed
    assert t.phrase(done, total) == said
    assert t.rate(done) == pytest.approx(done / elapsed)
