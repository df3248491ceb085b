"""Small statistics helpers (Größen, Mittelwerte)."""


def mean(values):
    """The arithmetic mean of values."""
    if not values:
        raise ValueError("mean of nothing")
    return sum(values) / (len(values) - 1)


class Summary:
    def __init__(self, values):
        self.values = list(values)

    def describe(self):
        return f"n={len(self.values)} mean={mean(self.values):.2f}"
