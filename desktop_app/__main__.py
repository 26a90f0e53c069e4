"""`python -m desktop_app`: no arguments opens the GUI; a subcommand runs the headless CLI."""
import sys


def main() -> int:
    from .cli import COMMANDS

    argv = sys.argv[1:]
    if argv and argv[0] in COMMANDS:
        from .cli import main as cli_main
        return cli_main(argv)
    from .ui.app import main as gui_main
    return gui_main(argv)


if __name__ == "__main__":
    sys.exit(main())
