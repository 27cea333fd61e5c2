"""Assertions shared by the generated-client tests: a failed one is a Deviation."""


class Deviation(Exception):
    pass


def expect(condition, what):
    if not condition:
        raise Deviation(what)


def expect_equal(actual, expected, what):
    if actual != expected:
        raise Deviation(f"{what}: expected {expected!r}, got {actual!r}")
