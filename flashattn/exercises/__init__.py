"""Exercise checks, one module per notebook topic. Each ``check_*`` takes the learner's function.

A check prints a short success line and returns True; explains what is wrong by raising
``ExerciseFailed`` (an AssertionError); and, for a stub not filled in yet (it raises
NotImplementedError), prints a reminder and returns False, so the notebook still runs top to bottom.
"""

from flashattn.reference import rel_error

from ._check import ExerciseFailed, exercise

__all__ = ["ExerciseFailed", "exercise", "rel_error"]
