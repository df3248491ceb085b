"""model.plan: the default keeps the host's order; bad input raises, so the
host applies its own default."""

import unittest

from klbr_hooks import model


def data(**kw):
    d = {"session": "default", "purpose": "turn", "directed": False,
         "routes": [{"name": "main", "model": "m", "dialect": "openai", "down": False},
                    {"name": "local", "model": "l", "dialect": "ollama", "down": False}],
         "default": ["main", "local"]}
    d.update(kw)
    return d


class ModelPlanTest(unittest.TestCase):
    def test_default_order(self):
        out = model.plan(data())
        self.assertEqual(out["routes"], ["main", "local"])
        self.assertIn("default", out["reason"])

    def test_default_is_a_copy(self):
        d = data()
        out = model.plan(d)
        out["routes"].append("x")
        self.assertEqual(d["default"], ["main", "local"])

    def test_bad_input_raises(self):
        for bad in (data(purpose="chat"), data(directed="yes"), data(routes={}),
                    data(default=[]), data(default=["gone"]), "x"):
            with self.subTest(bad=bad):
                with self.assertRaises(ValueError):
                    model.plan(bad)


if __name__ == "__main__":
    unittest.main()
