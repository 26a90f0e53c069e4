"""Issue 25, probes beyond its list: a geom:LO:HI:COUNT with an absurd COUNT is refused in one line
before numpy allocates COUNT floats (geom:2:512:1000000000 took 8 GB and minutes, without a word)."""
from __future__ import annotations

import pytest

from desktop_app.core import lipschitz as lip


@pytest.mark.parametrize("text", ["geom:2:512:1000000000000", "geom:2:512:0", "geom:2:512:-3",
                                  "geom:0:512:5", "geom:512:2:5", "geom:-8:512:5"])
def test_geom_lengths_out_of_range_are_refused_by_name(text):
    with pytest.raises(ValueError, match=r"geom:LO:HI:COUNT needs 2 <= LO <= HI and COUNT from 1 to 1000"):
        lip.parse_lengths(text)


def test_geom_lengths_within_range_still_parse():
    assert lip.parse_lengths("geom:2:512:1000")[:3] == [2, 3, 4]  # distinct, rounded
    assert lip.parse_lengths("geom:8:8:1") == [8]
