"""``python -m autotune``: the same command line as the ``autotune`` console script."""

from autotune.cli import main

if __name__ == "__main__":
    main(prog_name="autotune")
