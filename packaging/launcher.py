"""Entry script of the PyInstaller bundle: the same dispatch as `python -m desktop_app`
(no arguments or a model folder: the GUI; a subcommand: the headless CLI)."""
import multiprocessing
import sys

from desktop_app.__main__ import main

if __name__ == "__main__":
    multiprocessing.freeze_support()  # worker processes (e.g. multi-process training) re-enter here
    sys.exit(main())
