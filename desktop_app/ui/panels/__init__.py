"""The panels of the main window, in tab order: (title, module, class).

A panel is a QWidget constructed as Panel(state: AppState, parent=None). It may define
`help_text` (a short "What am I looking at?" text with its formula), `title`, and a class attribute
`shortcuts`: (key, what it does) pairs for its own keys, listed in Help > Keyboard Shortcuts.
"""
PANELS = [
    ("Model", "desktop_app.ui.panels.model", "ModelPanel"),
    ("Generate", "desktop_app.ui.panels.generation", "GenerationPanel"),
    ("Attention", "desktop_app.ui.panels.attention", "AttentionPanel"),
    ("Layers", "desktop_app.ui.panels.layers", "LayersPanel"),
    ("Image", "desktop_app.ui.panels.image", "ImagePanel"),
    ("What if", "desktop_app.ui.panels.whatif", "WhatIfPanel"),
    ("Features", "desktop_app.ui.panels.features", "FeaturesPanel"),
    ("Lipschitz", "desktop_app.ui.panels.lipschitz", "LipschitzPanel"),
    ("Dynamics", "desktop_app.ui.panels.dynamics", "DynamicsPanel"),
    ("Train", "desktop_app.ui.panels.training", "TrainingPanel"),
    ("Graph", "desktop_app.ui.panels.graph", "GraphPanel"),
]


def key_buttons(shortcuts, buttons) -> None:
    """Give each button its key from a panel's `shortcuts` ((key, what) pairs, in the buttons' order, the
    same pairs Help lists). A key clicks its button only while the button is on show and enabled (Qt
    matches a button's shortcut only then), so panels on other tabs can use the same keys."""
    from PySide6.QtGui import QKeySequence

    for (key, _what), button in zip(shortcuts, buttons, strict=True):
        button.setShortcut(QKeySequence(key))
        tip = button.toolTip()
        button.setToolTip(f"{tip} ({key})" if tip else key)
