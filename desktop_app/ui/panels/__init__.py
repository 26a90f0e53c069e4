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


CANCEL_KEY = "Esc"  # the key of every panel's Cancel (and Train's Stop)


def key_buttons(shortcuts, buttons) -> None:
    """Give each button its key from a panel's `shortcuts` ((key, what) pairs, in the buttons' order, the
    same pairs Help lists). A key clicks its button only while the button is on show and enabled (Qt
    matches a button's shortcut only then), so panels on other tabs can use the same keys. Where two
    buttons with Esc are on show at once (the Features lens's Cancel, in the panel's header, and the
    dashboard's on its tab), Esc clicks each of them: Qt clicks neither of an ambiguous key's buttons."""
    from PySide6.QtGui import QKeySequence

    for (key, _what), button in zip(shortcuts, buttons, strict=True):
        button.setShortcut(QKeySequence(key))
        tip = button.toolTip()
        button.setToolTip(f"{tip} ({key})" if tip else key)
    cancels = [b for (key, _what), b in zip(shortcuts, buttons) if key == CANCEL_KEY]
    if len(cancels) > 1:
        _click_all_on_show(cancels)


def _click_all_on_show(buttons) -> None:
    """Esc matching several of `buttons` (Qt sends its ambiguous shortcut event to one of them and clicks
    none) clicks every one on show and enabled: each Cancel a person sees stops, as Help lists Esc for each.
    (For Cancel only: two jobs started by one Ctrl+Return would be a surprise; an ambiguous Run stays Qt's.)"""
    from PySide6.QtCore import QEvent, QObject

    class ClickAllOnShow(QObject):
        def eventFilter(self, watched, event) -> bool:
            if event.type() != QEvent.Type.Shortcut or not event.isAmbiguous():
                return False  # (one match: the button's own click)
            for button in buttons:
                if button.isVisible() and button.isEnabled():
                    button.animateClick()  # (as Qt clicks a key's button: pressed for 100 ms)
            return True

    clicker = ClickAllOnShow(buttons[0])  # (a child of a button: it lives as long as the panel)
    for button in buttons:
        button.installEventFilter(clicker)
