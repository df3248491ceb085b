import unittest

from calc.stats import Summary, mean


class MeanTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3]), 2)

    def test_summary(self):
        self.assertEqual(Summary([2, 4]).describe(), "n=2 mean=3.00")


if __name__ == "__main__":
    unittest.main()
