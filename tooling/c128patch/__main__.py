"""The console entry (`c128patch`) and `python -m c128patch`: the click CLI of cli/."""

import gc

from c128patch import cli


def main() -> None:
    """One short-lived process: the cyclic collector runs less often (it walks every parsed syntax tree the
    contract keeps: derive ~15 % less CPU); cycles are still collected."""
    gc.set_threshold(100_000, 50, 100)
    cli.main()  # click exits with the command's code


if __name__ == "__main__":
    main()
