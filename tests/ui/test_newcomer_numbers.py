"""Issue 41, what a newcomer met: numbers written for people (a random model's perplexity)."""
from __future__ import annotations

from desktop_app.ui.panels.model import perplexity, perplexity_text


def test_a_huge_perplexity_is_written_short():
    assert perplexity_text(47.34) == "47.3"
    assert perplexity_text(47006289042225504.0) == "4.7e+16"  # was "47006289042225504.0"
    assert perplexity_text(perplexity([1e-17, 1e-16])) == perplexity_text(10 ** 16.5)
