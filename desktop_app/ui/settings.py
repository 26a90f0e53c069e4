"""Persistent settings (QSettings, INI format): preferences, recent models, window geometry.

INI everywhere so the file is readable and tests can redirect it with
QSettings.setPath(IniFormat, UserScope, folder). Application and organisation names are set
by app.main() before the first use.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtGui import QFont, QPalette, QColor
from PySide6.QtWidgets import QApplication

ORGANIZATION = "transformer-explorer"
APPLICATION = "Transformer Explorer"
RECENT_KEY = "recent_models"
MAX_RECENT = 10
THEMES = ("system", "light", "dark")
DEFAULT_DTYPES = ("auto", "float32", "bfloat16", "float16")


def settings() -> QSettings:
    return QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, ORGANIZATION, APPLICATION)


# -- recent models ---------------------------------------------------------------------------


def recent_models() -> list[str]:
    """The last MAX_RECENT models opened, newest first (a settings file listing 50,000 made File > Open
    Recent take 13 s to open, a menu 286,000 pixels wide)."""
    value = settings().value(RECENT_KEY, [])
    if isinstance(value, str):  # QSettings gives a bare string for a one-element list
        value = [value]
    if not isinstance(value, list):
        return []
    return [str(v) for v in value[:MAX_RECENT] if v]


def add_recent_model(path: str | Path) -> list[str]:
    path = str(Path(path).resolve())
    items = [path] + [p for p in recent_models() if p != path]
    items = items[:MAX_RECENT]
    settings().setValue(RECENT_KEY, items)
    return items


def clear_recent_models() -> None:
    settings().setValue(RECENT_KEY, [])


# -- the last folder a file dialog used -------------------------------------------------------

LAST_FOLDER_KEY = "paths/last_folder"


def last_folder() -> str:
    """The folder of the last file saved or opened through a dialog ("" before the first, or when it
    no longer exists): the next dialog opens there."""
    folder = str(settings().value(LAST_FOLDER_KEY, "") or "")
    return folder if folder and Path(folder).is_dir() else ""


def set_last_folder(folder: str | Path) -> None:
    settings().setValue(LAST_FOLDER_KEY, str(Path(folder).resolve()))


# -- the input setting: the tokenizer's special tokens -----------------------------------------

SPECIAL_TOKENS_KEY = "input/special_tokens"


def special_tokens_on() -> bool:
    """Whether text gets the tokenizer's special tokens ([CLS] ... [SEP], <s> ... </s>, BOS), as
    transformers adds them (the default), or is traced bare (the Model panel's checkbox)."""
    return _bool(settings().value(SPECIAL_TOKENS_KEY, True))


def set_special_tokens_on(on: bool) -> None:
    settings().setValue(SPECIAL_TOKENS_KEY, bool(on))


# -- preferences -----------------------------------------------------------------------------


MAX_FONT_SIZE = 32  # points: the Preferences dialog's range; a settings file saying more is not applied


@dataclass
class Preferences:
    device: str = "auto"  # "auto": CUDA/MPS when present, else CPU
    dtype: str = "auto"  # "auto": the dtype stored in the model's config
    theme: str = "system"
    font_size: int = 0  # 0: the platform's default; at most MAX_FONT_SIZE (the dialog's range)
    restore_session: bool = True

    @classmethod
    def load(cls) -> "Preferences":
        s = settings()
        d = cls()
        prefs = cls(
            device=str(s.value("prefs/device", d.device)),
            dtype=str(s.value("prefs/dtype", d.dtype)),
            theme=str(s.value("prefs/theme", d.theme)),
            font_size=_int(s.value("prefs/font_size", d.font_size), d.font_size),
            restore_session=_bool(s.value("prefs/restore_session", d.restore_session)),
        )
        if prefs.theme not in THEMES:
            prefs.theme = d.theme
        if prefs.dtype not in DEFAULT_DTYPES:
            prefs.dtype = d.dtype
        if not 0 <= prefs.font_size <= MAX_FONT_SIZE:  # 10**12 stopped every start (OverflowError in Qt)
            prefs.font_size = d.font_size
        return prefs

    def save(self) -> None:
        s = settings()
        for key, value in asdict(self).items():
            s.setValue(f"prefs/{key}", value)
        s.sync()


def _int(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _bool(value) -> bool:
    if isinstance(value, str):
        return value.lower() in ("1", "true", "yes")
    return bool(value)


# -- appearance ------------------------------------------------------------------------------

_default_font: QFont | None = None
_default_palette: QPalette | None = None
_default_style = ""
_plot_colours: tuple[int, int] | None = None  # (background, foreground) the plots were last given


def apply_appearance(app: QApplication, theme: str, font_size: int) -> None:
    """Theme (light/dark, or follow the system) and base font size for the whole application."""
    global _default_font, _default_palette, _default_style
    from PySide6.QtCore import Qt

    if _default_font is None:
        _default_font, _default_palette = QFont(app.font()), QPalette(app.palette())
        _default_style = app.style().name()
    font = QFont(_default_font)
    if font_size and 0 < font_size <= MAX_FONT_SIZE:
        font.setPointSize(int(font_size))
    app.setFont(font)
    hints = app.styleHints()
    scheme = {"light": Qt.ColorScheme.Light, "dark": Qt.ColorScheme.Dark}.get(theme, Qt.ColorScheme.Unknown)
    if hasattr(hints, "setColorScheme"):  # Qt >= 6.8
        hints.setColorScheme(scheme)
    # Platforms without a native dark style (offscreen, some Linux desktops) need an explicit palette.
    if theme == "dark":
        app.setStyle("Fusion")
        app.setPalette(dark_palette())
    elif theme == "light":
        app.setStyle("Fusion")
        app.setPalette(app.style().standardPalette())
    else:  # back to the system's own style and palette
        if app.style().name() != _default_style:
            app.setStyle(_default_style)
        app.setPalette(_default_palette)
    global _plot_colours
    colours = (plot_background().rgba(), plot_foreground().rgba())
    if colours != _plot_colours:  # pyqtgraph draws its own backgrounds: they do not follow the palette
        if _plot_colours is not None or palette_is_dark():
            restyle_plots()
        _plot_colours = colours


def plot_background() -> QColor:
    """Plots follow the theme: the palette's base colour (white in light themes)."""
    app = QApplication.instance()
    return (app.palette() if app is not None else QPalette()).color(QPalette.ColorRole.Base)


def plot_foreground() -> QColor:
    """Axes, tick labels and titles of plots: the palette's text colour."""
    app = QApplication.instance()
    return (app.palette() if app is not None else QPalette()).color(QPalette.ColorRole.Text)


def palette_is_dark() -> bool:
    return plot_background().lightness() < 128


def restyle_plots(root=None) -> None:
    """Give the pyqtgraph plots under `root` (default: every widget) the theme's background and axis,
    tick and title colours; plots made after a theme change take them from plot_background() and
    plot_foreground() when built."""
    import pyqtgraph as pg

    app = QApplication.instance()
    if app is None:
        return
    import shiboken6

    roots = [root] if root is not None else [w for w in app.topLevelWidgets() if w.isVisible()]  # not orphans
    views = []
    for r in roots:
        if shiboken6.isValid(r):
            views += ([r] if isinstance(r, pg.GraphicsView) else []) + r.findChildren(pg.GraphicsView)
    bg, fg = plot_background(), plot_foreground()
    for view in views:
        view.setBackground(bg)
        for item in view.scene().items():
            if isinstance(item, pg.AxisItem):
                item.setPen(pg.mkPen(fg))
                item.setTextPen(pg.mkPen(fg))
            elif isinstance(item, pg.PlotItem) and item.titleLabel.text:
                item.titleLabel.setText(item.titleLabel.text, color=fg)


def dark_palette() -> QPalette:
    p = QPalette()
    base, window, text = QColor(30, 30, 30), QColor(45, 45, 48), QColor(230, 230, 230)
    role = QPalette.ColorRole
    p.setColor(role.Window, window)
    p.setColor(role.WindowText, text)
    p.setColor(role.Base, base)
    p.setColor(role.AlternateBase, window)
    p.setColor(role.ToolTipBase, window)
    p.setColor(role.ToolTipText, text)
    p.setColor(role.Text, text)
    p.setColor(role.Button, window)
    p.setColor(role.ButtonText, text)
    p.setColor(role.BrightText, QColor(255, 80, 80))
    p.setColor(role.Link, QColor(90, 160, 255))
    p.setColor(role.Highlight, QColor(60, 120, 200))
    p.setColor(role.HighlightedText, QColor(255, 255, 255))
    p.setColor(role.PlaceholderText, QColor(140, 140, 140))
    for r in (role.WindowText, role.Text, role.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, r, QColor(120, 120, 120))
    return p
