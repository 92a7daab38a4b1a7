"""The machinery every ``check_*`` shares."""

from __future__ import annotations

import functools

from flashattn.reference import rel_error  # noqa: F401  (the checks compare through it)


class ExerciseFailed(AssertionError):
    """The learner's function ran but computed something wrong; the message says what."""


class _NotAttempted(Exception):
    pass


def call(fn, *args, **kwargs):
    """Call the learner's function, turning NotImplementedError into 'not attempted yet'."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as err:
        raise _NotAttempted from err


def exercise(name: str):
    """Decorator for a check: handles the not-attempted case and prints the success line."""

    def wrap(check):
        @functools.wraps(check)
        def run(fn, *args, **kwargs):
            try:
                detail = check(fn, *args, **kwargs)
            except _NotAttempted:
                print(f"[{name}] not attempted yet: fill in the function above, then run this cell again "
                      "(a worked solution is in the collapsed cell below).")
                return False
            print(f"[{name}] passed" + (f": {detail}" if detail else ""))
            return True

        return run

    return wrap
