"""The command line's names and exit statuses, which the CLI, its commands and the GUI's --help all share.

Kept below the front ends so that ui/ (whose --help lists the commands) and commands/ (which return these
statuses) never import desktop_app.cli, the CLI's entry point (tests/test_layering.py checks it).
"""
COMMANDS = ("info", "trace", "generate", "render", "lipschitz", "train", "bench", "families", "dynamics", "attribute", "patch", "scrub",
            "features", "export", "graph")
COMMANDS_HELP = ("Headless commands (no window): " + ", ".join(COMMANDS)
                 + ". Each has its own help: python -m desktop_app COMMAND --help")
EXIT_INPUT = 2  # bad input: a file that cannot be used, a wrong option, an output folder refused
EXIT_DIVERGED = 3  # train: the loss or the gradient became non-finite
EXIT_WRITE = 4  # an output could not be written (read-only, disk full, a folder in the way...)
