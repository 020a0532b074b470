"""The serving host (``c128patch doctor``): the installed sglang, its build, what the series' envs and its
startup would do (the installed code run only in time-bounded child processes), the JIT toolchain."""
