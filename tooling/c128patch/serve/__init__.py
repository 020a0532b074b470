"""The serving host: what sglang is installed where, whether it is a c128patch build intact on disk,
what the series' env vars will do there, what startup would refuse, and the JIT toolchain
(``c128patch doctor``). Nothing here imports sglang or torch: the installed files are read, and the
two stdlib-only modules doctor runs (sglang's ``srt/environ.py``, the series' startup rules) are
loaded by file path."""
