#!/bin/sh
# Install (or remove) Transformer Explorer's desktop entry and icons for the current user.
#
#   packaging/install_desktop_entry.sh [--exec PROGRAM] [--prefix DIR] [--uninstall]
#
# PROGRAM (the executable to launch) defaults to the `transformer-explorer` on PATH, else this
# checkout's .venv python running `-m desktop_app`, else the PyInstaller bundle in dist/. DIR defaults to
# ${XDG_DATA_HOME:-~/.local/share}. Nothing is written outside DIR (and a temporary folder).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
prefix=${XDG_DATA_HOME:-$HOME/.local/share}
exec_cmd=""
uninstall=0
while [ $# -gt 0 ]; do
    case "$1" in
        --exec) exec_cmd=$2; shift 2 ;;
        --prefix) prefix=$2; shift 2 ;;
        --uninstall) uninstall=1; shift ;;
        -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
        *) echo "install_desktop_entry.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done

name=transformer-explorer
apps="$prefix/applications"
icons="$prefix/icons/hicolor"
sizes="16 24 32 48 64 128 256 512"

if [ "$uninstall" = 1 ]; then
    rm -f "$apps/$name.desktop" "$icons/scalable/apps/$name.svg"
    for s in $sizes; do rm -f "$icons/${s}x${s}/apps/$name.png"; done
    echo "removed $apps/$name.desktop and its icons"
    exit 0
fi

quote() {  # Exec= arguments with spaces or specials are double-quoted (Desktop Entry spec)
    case "$1" in
        *[\ \"\'\\\$\`]*) printf '"%s"' "$(printf '%s' "$1" | sed 's/[\\"`$]/\\&/g')" ;;
        *) printf '%s' "$1" ;;
    esac
}

if [ -z "$exec_cmd" ]; then
    if command -v transformer-explorer >/dev/null 2>&1; then
        exec_cmd=$(quote "$(command -v transformer-explorer)")
        try_exec=$(command -v transformer-explorer)
    elif [ -x "$repo/.venv/bin/python" ]; then
        exec_cmd="$(quote "$repo/.venv/bin/python") -m desktop_app"
        try_exec="$repo/.venv/bin/python"
    elif [ -x "$repo/dist/transformer-explorer/transformer-explorer" ]; then
        exec_cmd=$(quote "$repo/dist/transformer-explorer/transformer-explorer")
        try_exec="$repo/dist/transformer-explorer/transformer-explorer"
    else
        echo "install_desktop_entry.sh: no transformer-explorer found; install the package or pass --exec" >&2
        exit 1
    fi
else
    try_exec=$exec_cmd
    exec_cmd=$(quote "$exec_cmd")
fi

mkdir -p "$apps" "$icons/scalable/apps"
cp "$repo/resources/icons/$name.svg" "$icons/scalable/apps/$name.svg"
for s in $sizes; do
    mkdir -p "$icons/${s}x${s}/apps"
    cp "$repo/resources/icons/$name-$s.png" "$icons/${s}x${s}/apps/$name.png"
done

# sed replacement text: escape \, & and the | delimiter
esc() { printf '%s' "$1" | sed 's/[\\&|]/\\&/g'; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed -e "s|@EXEC@|$(esc "$exec_cmd")|" -e "s|@TRYEXEC@|$(esc "$try_exec")|" -e "s|@ICON@|$name|" \
    "$repo/resources/$name.desktop.in" > "$work/$name.desktop"
if command -v desktop-file-validate >/dev/null 2>&1; then
    desktop-file-validate "$work/$name.desktop"
fi
cp "$work/$name.desktop" "$apps/.$name.desktop.tmp"
mv "$apps/.$name.desktop.tmp" "$apps/$name.desktop"  # atomic: the menu never sees half a file

command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database "$apps" >/dev/null 2>&1 || true
command -v gtk-update-icon-cache >/dev/null 2>&1 && gtk-update-icon-cache -q -t "$icons" >/dev/null 2>&1 || true
echo "installed $apps/$name.desktop (Exec=$exec_cmd)"
