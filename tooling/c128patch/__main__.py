"""The console entry (`c128patch`) and `python -m c128patch`: the click CLI of cli/."""

from c128patch.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    main()  # click exits with the command's code
