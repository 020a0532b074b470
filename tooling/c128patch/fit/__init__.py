"""Does the series still fit upstream: the API contract (``contract``), the checks of a patched tree
(``treecheck``: the CPU checks and the behavioural tier), ``watch`` (carry onto upstream and judge it),
``bisect`` and the series audit. Above ``ops``: it carries trees with the engine, never the reverse."""
