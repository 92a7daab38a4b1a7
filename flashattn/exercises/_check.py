"""The machinery every ``check_*`` shares."""

from __future__ import annotations

import functools

from flashattn.reference import rel_error  # noqa: F401  (the checks compare through it)


class ExerciseFailed(AssertionError):
    """The learner's function ran but computed something wrong; the message says what."""


class _NotAttempted(Exception):
    """The learner's function (or ``what``, when given: one of several) is still the stub."""

    def __init__(self, what: str | None = None):
        super().__init__(what)
        self.what = what


def call(fn, *args, what: str | None = None, **kwargs):
    """Call the learner's function, turning NotImplementedError into 'not attempted yet' (of ``what``). Any
    other error it raises is the learner's own and goes through as it is (with their traceback)."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as err:
        raise _NotAttempted(what) from err
    except Exception as err:
        err._raised_by_the_learner = True
        raise


INTERNAL = ("the check stopped on an error of its own ({error}) while it examined your result, so it cannot say "
            "what is wrong with it (a defect of the check: please report it). Compare your code with the worked "
            "solution in the collapsed cell below.")


def exercise(name: str):
    """Decorator for a check: handles the not-attempted case and prints the success line. Every way a check can
    end on a wrong answer is ExerciseFailed with a message: an error of the check's own (an IndexError in a
    diagnosis, say) becomes one that says so, never a traceback from inside the package. Errors the learner's
    own Python function raises (through ``call``) go through unchanged."""

    def wrap(check):
        @functools.wraps(check)
        def run(fn, *args, **kwargs):
            try:
                detail = check(fn, *args, **kwargs)
            except _NotAttempted as err:
                if err.what:  # part of the exercise passed, another part is still the stub
                    print(f"[{name}] {err.what} is not attempted yet: fill it in, then run this cell again (a "
                          "worked solution is in the collapsed cell below).")
                else:
                    print(f"[{name}] not attempted yet: fill in the function above, then run this cell again "
                          "(a worked solution is in the collapsed cell below).")
                return False
            except ExerciseFailed:
                raise
            except Exception as err:  # a defect of the check: the learner gets a message, not its traceback
                if getattr(err, "_raised_by_the_learner", False):
                    raise
                raise ExerciseFailed(f"[{name}] " + INTERNAL.format(error=f"{type(err).__name__}: {err}")) from None
            print(f"[{name}] passed" + (f": {detail}" if detail else ""))
            return True

        return run

    return wrap
