"""The console entry (`c128patch`, pyproject's `c128patch.__main__:main`) and `python -m c128patch`: the
click CLI of cli/, whose `--help` lists the verbs from its table without importing any of them."""

from c128patch.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    main()  # click exits with the command's code
