"""The options of smoke's subcommands that run pytest passes over trees (kernel, upstream)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable

import click

from c128patch.cli.common import locate_tree
from c128patch.errors import C128Error

_TREE_OPTIONS = (
    click.option("--tree", type=click.Path(file_okay=False, path_type=Path),
                 help="Patched sources: a checkout (uses python/) or a folder holding sglang/ "
                      "(default, without --wheel: the tree `status` finds)."),
    click.option("--wheel", type=click.Path(dir_okay=False, path_type=Path), help="A patched sglang wheel."),
    click.option("--upstream-tree", type=click.Path(file_okay=False, path_type=Path),
                 help="Unpatched sources (default: derived from the tree's provenance record)."),
    click.option("--list", "--collect-only", "collect_only", is_flag=True, help="List the tests, run none."),
    click.option("-k", "keyword", help="Only tests matching this pytest -k expression."),
    click.option("--suite", type=click.Path(file_okay=False, path_type=Path),
                 help="The GPU suite (default: the one this tool carries)."),
    click.option("--timeout", type=float, default=1800.0, show_default=True, help="Seconds per pytest pass."),
    click.option("--stage", "stage_dir", type=click.Path(file_okay=False, path_type=Path),
                 help="Copy what the tests read from the trees into DIR (to carry to a GPU machine) and stop."),
)


def tree_options(fn: Callable) -> Callable:
    """The patched and the unpatched sources and how the suite runs: kernel's and upstream's."""
    for decorator in reversed(_TREE_OPTIONS):
        fn = decorator(fn)
    return fn


def kernel_options(fields: dict[str, Any], **more: Any) -> Any:
    """A ``smoke.trees.KernelOptions`` of the shared options; the tree `status` finds (when it
    holds sglang sources) where neither --tree nor --wheel is given."""
    from c128patch.smoke.trees import KernelOptions

    if fields["tree"] is None and fields["wheel"] is None:
        with contextlib.suppress(C128Error):
            found = locate_tree(None)
            fields["tree"] = found if (found / "python" / "sglang").is_dir() else None
    return KernelOptions(**fields, **more)
