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
