"""The behavior tree's own tests (unittest, standard library only).

Run from the repository root:

    PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -s behavior/tests -t behavior

The tree is published as an immutable release that refuses bytecode. Setting
the flag here as well keeps the test modules imported after this one from
writing any; test_tree reports a ``__pycache__`` that slipped in anyway.
"""

import os
import sys

sys.dont_write_bytecode = True

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
