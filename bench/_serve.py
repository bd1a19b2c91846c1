"""``python -m bench._serve ARGS``: the ``millstream`` command, runnable as a module.

The harness starts the millstream server as ``python -m bench._serve standalone ...`` so
that, with ``--profile``, it can run the same command under ``python -m cProfile -o FILE -m ...``
(cProfile takes a module or a script, and the ``millstream`` script's path depends on the install).
"""

from __future__ import annotations

from millstream.cli import main

if __name__ == "__main__":
    main()
