import os
import tempfile
import unittest

from klbr_hooks import settings


class SettingsTest(unittest.TestCase):
    def test_shipped_settings(self):
        s = settings.load()
        self.assertEqual(s.ambient_defer_seconds, 8.0)   # the compatibility default
        self.assertEqual(s, settings.SETTINGS)
        self.assertEqual(os.path.basename(settings.PATH), "settings.toml")

    def load_text(self, text):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "settings.toml")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            return settings.load(path)

    def test_valid_values(self):
        self.assertEqual(self.load_text("[attention]\nambient_defer_seconds = 0\n")
                         .ambient_defer_seconds, 0.0)
        self.assertEqual(self.load_text("[attention]\nambient_defer_seconds = 2.5\n")
                         .ambient_defer_seconds, 2.5)
        self.assertEqual(self.load_text("[attention]\nambient_defer_seconds = 600\n"
                                        "[discord]\nanything = 'else'\n").ambient_defer_seconds,
                         600.0)

    def test_refused(self):
        cases = [
            ("", "required"),
            ("[attention]\n", "required"),
            ("attention = 3\n", "must be a table"),
            ("[attention]\nambient_defer_seconds = -1\n", "[0, 600]"),
            ("[attention]\nambient_defer_seconds = 601\n", "[0, 600]"),
            ("[attention]\nambient_defer_seconds = inf\n", "must be a number"),
            ("[attention]\nambient_defer_seconds = nan\n", "must be a number"),
            ("[attention]\nambient_defer_seconds = true\n", "must be a number"),
            ("[attention]\nambient_defer_seconds = '8'\n", "must be a number"),
            ("[attention]\nambient_defer_seconds = 8\nambient_defer_second = 9\n", "unknown key"),
            ("[attention\n", "not valid TOML"),
        ]
        for text, mentions in cases:
            with self.subTest(text=text):
                with self.assertRaises(ValueError) as cm:
                    self.load_text(text)
                self.assertIn(mentions, str(cm.exception))

    def test_missing_file(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(ValueError) as cm:
                settings.load(os.path.join(d, "settings.toml"))
        self.assertIn("missing", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
