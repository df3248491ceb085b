"""Größen: a module with multi-byte text before its symbols (ü, 日本語, 🎉)."""
import functools

LIMIT = 10


@functools.cache
def greet(name: str) -> str:
    return f"héllo {name}"


class Greeter:
    """Says hello."""

    def greet(self, name):
        return greet(name)

    @staticmethod
    def shout(name):
        return greet(name).upper()
