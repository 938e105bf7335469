"""``python -m bench``: issue 7's suite (bench/suite.py)."""

from bench.suite import main

main()
