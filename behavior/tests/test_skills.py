import os
import unittest

import klbr_skills
from tests import ROOT

SKILLS = os.path.join(ROOT, "skills")
BUILTIN = {"workspace", "maintenance", "discord", "code"}


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


class SkillFilesTest(unittest.TestCase):
    def test_every_skill_declares_its_directory_name(self):
        names = sorted(os.listdir(SKILLS))
        self.assertTrue(names)
        for name in names:
            with self.subTest(skill=name):
                path = os.path.join(SKILLS, name)
                self.assertTrue(os.path.isdir(path), f"skills/{name} is not a directory")
                self.assertEqual(os.listdir(path), ["SKILL.md"],
                                 f"skills/{name} must hold exactly one SKILL.md")
                body = read(os.path.join(path, "SKILL.md"))
                first = next(line for line in body.splitlines() if line.strip())
                self.assertEqual(first, f"# {name}")
                self.assertEqual(klbr_skills.problems(name, body), [])
                # the publisher's id rule; builtin ids are also identifiers,
                # so help(skills.<id>) can name them
                self.assertRegex(name, r"^[a-z0-9][a-z0-9_-]{0,63}$")
                self.assertTrue(name.isidentifier(), name)
                self.assertGreater(len(body.strip()), len(first) + 100, "a body, not just a title")

    def test_builtin_ids(self):
        self.assertLessEqual(BUILTIN, set(os.listdir(SKILLS)))


class HelpersTest(unittest.TestCase):
    def test_skill_id(self):
        self.assertEqual(klbr_skills.skill_id("# workspace\nbody"), "workspace")
        self.assertEqual(klbr_skills.skill_id("\n  \n# discord  \n"), "discord")
        for body in ("", "\n\n", "workspace\n# workspace", "## workspace", "#workspace", "# "):
            with self.subTest(body=body):
                self.assertIsNone(klbr_skills.skill_id(body))

    def test_problems(self):
        self.assertEqual(klbr_skills.problems("a", "# a\ntext"), [])
        self.assertIn("directory", klbr_skills.problems("a", "# b\ntext")[0])
        self.assertIn("first non-empty line", klbr_skills.problems("a", "text\n# a")[0])

    def test_ids(self):
        self.assertEqual(klbr_skills.ids({"b": "# b", "a": "\n# a\n"}), ["a", "b"])
        self.assertEqual(klbr_skills.ids({}), [])
        with self.assertRaises(ValueError) as cm:
            klbr_skills.ids({"a": "# a", "b": "# c", "d": "no title"})
        self.assertIn("b:", str(cm.exception))
        self.assertIn("d:", str(cm.exception))
        self.assertNotIn("a:", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
