"""Issue 25, probes beyond its list: a Gaussian start's covariance of 'inf' or 'nan' is refused by
name (the Dynamics panel said "Failed: Eigenvalues did not converge" for inf, and that a nan was not
a positive semi-definite matrix); `dynamics --variances` reads the same parser."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from desktop_app.core import dynamics as dy

from .walkthrough import click_panel_tab, open_window, type_into


@pytest.mark.parametrize("text", ["inf", "nan", "1 inf 1", "1 0 0; 0 nan 0; 0 0 1", "-inf"])
def test_non_finite_covariance_is_refused_by_name(text):
    with pytest.raises(ValueError, match="every number must be finite"):
        dy.parse_covariance(text, 3)


def test_the_panel_says_why_a_covariance_of_inf_is_refused(qtbot, model_dirs, isolated_user_files):
    window, _state = open_window(qtbot, model_dirs["demo"], name="demo")
    panel = click_panel_tab(qtbot, window, "Dynamics")
    panel.init.setCurrentIndex(panel.init.findData("gaussian"))
    type_into(qtbot, panel.covariance, "inf")
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "finite" in panel.status.text(), timeout=30_000)
    assert "covariance 'inf'" in panel.status.text()
