import unittest

from klbr_hooks import shaping, turn, execution


class DeliveryPrepareTest(unittest.TestCase):
    def test_a_5000_character_message_is_three_discord_parts(self):
        words = ("lorem ipsum dolor sit amet " * 200)[:5000]
        out = shaping.delivery({"channel": "discord", "destination": "d1", "session": "s",
                                "limit": 2000, "parts": [words]})
        self.assertEqual(len(out["parts"]), 3)
        for p in out["parts"]:
            self.assertLessEqual(len(p), 2000)
            self.assertTrue(p)
        self.assertEqual(" ".join(out["parts"]).split(), words.split())

    def test_paragraphs_are_kept_whole_when_they_fit(self):
        text = "a" * 1500 + "\n\n" + "b" * 1500
        self.assertEqual(shaping.split(text, 2000), ["a" * 1500, "b" * 1500])

    def test_the_limit_counts_characters_as_discord_does(self):
        # 1,999 CJK characters are 5,997 bytes and still one Discord message.
        self.assertEqual(shaping.split("漢" * 1999, 2000), ["漢" * 1999])
        # An emoji outside the BMP is one code point (two UTF-16 units).
        parts = shaping.split("😀" * 2001, 2000)
        self.assertEqual([len(p) for p in parts], [2000, 1])
        self.assertEqual("".join(parts), "😀" * 2001)

    def test_multibyte_text_is_never_cut_mid_character(self):
        parts = shaping.split("é" * 3000, 2000)
        self.assertEqual("".join(parts), "é" * 3000)
        self.assertTrue(all(len(p) <= 2000 for p in parts))

    def test_short_text_is_one_part(self):
        self.assertEqual(shaping.delivery({"limit": 10, "parts": ["hi"]})["parts"], ["hi"])


class DefaultsTest(unittest.TestCase):
    def test_defaults(self):
        self.assertEqual(turn.prepare({"wake": "input", "inputs": []})["decision"], "start")
        self.assertEqual(turn.next_step({"steps": 1, "tokens": 0, "calls": 1, "pending": 0, "budgets": {}})["decision"],
                         "continue")
        self.assertEqual(execution.review({"code": "1", "session": "s"})["decision"], "allow")
        self.assertEqual(shaping.context({"additions": ["x"]}), {"additions": ["x"]})
        self.assertEqual(shaping.present({"text": "t"}), {"text": "t"})


if __name__ == "__main__":
    unittest.main()
