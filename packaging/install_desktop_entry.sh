#!/bin/sh
# Install (or remove) Transformer Explorer's desktop entry and icons for the current user.
#
#   packaging/install_desktop_entry.sh [--exec PROGRAM] [--prefix DIR] [--uninstall]
#
# PROGRAM (the executable to launch) defaults to the `transformer-explorer` on PATH, else this
# checkout's .venv python running `-m desktop_app`, else the PyInstaller bundle in dist/. DIR defaults to
# ${XDG_DATA_HOME:-~/.local/share}. Nothing is written outside DIR (and a temporary folder).
# The entry it writes carries a marker line; --uninstall removes an entry only with that marker and
# icons only when they are the ones shipped here, and an entry without the marker is never replaced.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
prefix=${XDG_DATA_HOME:-$HOME/.local/share}
exec_cmd=""
uninstall=0
while [ $# -gt 0 ]; do
    case "$1" in
        --exec|--prefix)
            [ $# -ge 2 ] || { echo "install_desktop_entry.sh: $1 needs a value" >&2; exit 2; }
            if [ "$1" = --exec ]; then exec_cmd=$2; else prefix=$2; fi
            shift 2 ;;
        --uninstall) uninstall=1; shift ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "install_desktop_entry.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done

name=transformer-explorer
apps="$prefix/applications"
icons="$prefix/icons/hicolor"
sizes="16 24 32 48 64 128 256 512"
marker="X-Transformer-Explorer-Installer=install_desktop_entry.sh"  # how --uninstall knows the entry is ours

ours() { [ -f "$1" ] && grep -qx "$marker" "$1"; }
refresh_icon_cache() {  # update the user's icon cache if there is one; never create one (it would outlive us)
    if [ -f "$icons/icon-theme.cache" ] && command -v gtk-update-icon-cache >/dev/null 2>&1; then
        gtk-update-icon-cache -q -t "$icons" >/dev/null 2>&1 || true
    fi
}

if [ "$uninstall" = 1 ]; then
    if ours "$apps/$name.desktop"; then
        rm -f "$apps/$name.desktop"
        echo "removed $apps/$name.desktop"
    elif [ -e "$apps/$name.desktop" ]; then
        echo "install_desktop_entry.sh: left $apps/$name.desktop alone: this script did not write it" >&2
    fi
    # an icon is removed only when it is the one shipped here (the same bytes)
    for s in svg $sizes; do
        if [ "$s" = svg ]; then icon="$icons/scalable/apps/$name.svg"; shipped="$repo/resources/icons/$name.svg"
        else icon="$icons/${s}x${s}/apps/$name.png"; shipped="$repo/resources/icons/$name-$s.png"; fi
        if [ -f "$icon" ] && cmp -s "$icon" "$shipped"; then rm -f "$icon"; fi
    done
    refresh_icon_cache
    echo "removed its icons from $icons"
    exit 0
fi

if [ -e "$apps/$name.desktop" ] && ! ours "$apps/$name.desktop"; then
    echo "install_desktop_entry.sh: $apps/$name.desktop exists and this script did not write it; move it away first" >&2
    exit 1
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
    case "$exec_cmd" in  # a relative path made absolute: the menu starts the program from $HOME
        /*) ;;
        */*) dir=$(cd "$(dirname "$exec_cmd")" 2>/dev/null && pwd) || {
                 echo "install_desktop_entry.sh: --exec $exec_cmd: its folder does not exist" >&2; exit 2; }
             exec_cmd="$dir/$(basename "$exec_cmd")" ;;
    esac
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
echo "$marker" >> "$work/$name.desktop"
if command -v desktop-file-validate >/dev/null 2>&1; then
    desktop-file-validate "$work/$name.desktop"
fi
cp "$work/$name.desktop" "$apps/.$name.desktop.tmp"
mv "$apps/.$name.desktop.tmp" "$apps/$name.desktop"  # atomic: the menu never sees half a file

# no update-desktop-database: it indexes MimeType= only, which this entry has none of (it would leave
# a mimeinfo.cache behind that --uninstall cannot tell from the user's own)
refresh_icon_cache
echo "installed $apps/$name.desktop (Exec=$exec_cmd)"
