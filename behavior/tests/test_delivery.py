import unittest

from klbr_hooks import delivery


def send(**fields):
    data = {"channel": "local", "text": "done: the tests pass", "session": "default"}
    data.update(fields)
    return data


class ReviewTest(unittest.TestCase):
    def test_allows_by_default(self):
        for data in (send(), send(channel="discord", destination="d1"),
                     send(channel="discord", destination=None, frame={"id": 3, "items": [1, 2]}),
                     send(frame=None), send(text="ok", extra_field=True)):
            with self.subTest(data=data):
                out = delivery.review(data)
                self.assertEqual(out["decision"], "allow")
                self.assertIsInstance(out["reason"], str)
                self.assertTrue(out["reason"])

    def test_empty_text_is_held_with_a_reason(self):
        for text in ("", "   ", "\n\t "):
            with self.subTest(text=text):
                out = delivery.review(send(text=text))
                self.assertEqual(out["decision"], "hold")
                self.assertIn("nothing to say", out["reason"])

    def test_exact_result_keys(self):
        self.assertEqual(set(delivery.review(send())), {"decision", "reason"})
        self.assertEqual(set(delivery.review(send(text=""))), {"decision", "reason"})

    def test_malformed_input_raises(self):
        cases = [
            (None, "input"),
            ("hello", "input"),
            ({"text": "x", "session": "s"}, "input.channel"),
            (send(channel="email"), "input.channel"),
            (send(channel=None), "input.channel"),
            ({"channel": "local", "session": "s"}, "input.text"),
            (send(text=None), "input.text"),
            (send(text=b"bytes"), "input.text"),
            ({"channel": "local", "text": "x"}, "input.session"),
            (send(session=1), "input.session"),
            (send(destination=5), "input.destination"),
            (send(frame=[]), "input.frame"),
        ]
        for data, mentions in cases:
            with self.subTest(data=data):
                with self.assertRaises(ValueError) as cm:
                    delivery.review(data)
                self.assertIn(mentions, str(cm.exception))

    def test_input_untouched(self):
        data = send(frame={"items": [1]})
        before = repr(data)
        delivery.review(data)
        self.assertEqual(repr(data), before)


if __name__ == "__main__":
    unittest.main()
