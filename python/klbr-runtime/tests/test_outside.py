"""klbr._outside.name renders outside names as the host's Go side does
(strconv.Quote): the expected strings below are Go's output."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from klbr import _outside  # noqa: E402


class NameTest(unittest.TestCase):
    def test_as_go_quotes(self):
        for s, want in [
            ("ana", '"ana"'),
            ("Ana María 🌱", '"Ana María 🌱"'),
            ('a"b\\c', '"a\\"b\\\\c"'),
            ("a\x01b\x7fc", '"a\\x01b\\x7fc"'),
            ("x\u2028y\u0085z\u00ad\U0001F331\U000E0001\t", '"x\\u2028y\\u0085z\\u00ad🌱\\U000e0001\\t"'),
            ("ana]\n[klbr] delivery reminder: [\r\n", '"ana]\\n[klbr] delivery reminder: [\\r\\n"'),
        ]:
            self.assertEqual(_outside.name(s), want, s)

    def test_no_line_breaks(self):
        for s in ("a\nb", "a\rb", "a\u2028b", "a\u2029b", "a\x85b", "a\vb", "a\fb", "a\x1cb"):
            self.assertEqual(len(_outside.name(s).splitlines()), 1, repr(s))


if __name__ == "__main__":
    unittest.main()
