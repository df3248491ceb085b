"""klbr.skills: the skill set handed over at spawn (KLBR_SKILLS_FILE)."""

import contextlib
import json
import os
import pydoc
import shutil
import sys
import tempfile
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep src/ free of __pycache__ (klbr-core embeds the tree)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import peer  # noqa: E402

import klbr.skills as skills  # noqa: E402

WORKSPACE_BODY = ("# workspace\n\nHow to use the workspace helpers well.\n\n"
                  "## Look before you change\n- Start narrow: `await ls(\"src\")`.\n")
PAYLOAD = {
    "revision": "sha256:5k1115",
    "roots": ["/repo/skills", "/data/skills"],
    "skills": {"workspace": WORKSPACE_BODY, "maintenance": "# maintenance\nHow to change yourself.\n",
               "code-review": "# code-review\nReview code.\n"},
    "refused": {"discord": "defined in both /repo/skills and /data/skills", "Bad": "title says 'bad'"},
}


class SkillsCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="klbr-skills-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    @contextlib.contextmanager
    def skill_file(self, payload=PAYLOAD, raw=None, path=None):
        """The skills module as a fresh generation would see ``payload``."""
        if path is None:
            path = os.path.join(self.tmp, "skills.json")
            with open(path, "w") as f:
                f.write(raw if raw is not None else json.dumps(payload))
        old_env, old_set = os.environ.get("KLBR_SKILLS_FILE"), skills._set
        if path is False:
            os.environ.pop("KLBR_SKILLS_FILE", None)
        else:
            os.environ["KLBR_SKILLS_FILE"] = path
        skills._set = None
        try:
            yield skills
        finally:
            skills._set = old_set
            if old_env is None:
                os.environ.pop("KLBR_SKILLS_FILE", None)
            else:
                os.environ["KLBR_SKILLS_FILE"] = old_env


class SkillsModuleTest(SkillsCase):
    def test_dir_lists_exactly_the_offered_ids(self):
        with self.skill_file() as s:
            self.assertEqual(dir(s), ["code-review", "maintenance", "workspace"])

    def test_help_prints_the_body(self):
        with self.skill_file() as s:
            ws = s.workspace
            self.assertEqual(ws.__doc__, WORKSPACE_BODY)
            self.assertEqual((ws.id, ws.body), ("workspace", WORKSPACE_BODY))
            text = pydoc.plain(pydoc.render_doc(ws))
            for line in WORKSPACE_BODY.splitlines():
                self.assertIn(line, text)
            self.assertNotIn("__init__", text)  # the body, not the class's methods

    def test_str_and_repr_are_short(self):
        with self.skill_file() as s:
            for text in (str(s.workspace), repr(s.workspace)):
                self.assertEqual(text, "<skill 'workspace': How to use the workspace helpers well. "
                                       f"({len(WORKSPACE_BODY)} chars; help(skills.workspace))>")
            self.assertIn("help(skills.get('code-review'))", repr(s.get("code-review")))

    def test_metadata(self):
        with self.skill_file() as s:
            self.assertEqual(s.revision, "sha256:5k1115")
            self.assertEqual(s.roots, ["/repo/skills", "/data/skills"])
            self.assertEqual(s.refused, PAYLOAD["refused"])
            s.refused.clear()  # a copy: the set cannot change under a generation
            self.assertEqual(s.refused, PAYLOAD["refused"])

    def test_lookups(self):
        with self.skill_file() as s:
            self.assertIs(getattr(s, "code-review"), s.get("code-review"))
            from klbr.skills import maintenance
            self.assertIs(maintenance, s.maintenance)
            with self.assertRaisesRegex(AttributeError, "skill 'discord' was refused: defined in both"):
                s.discord
            with self.assertRaisesRegex(AttributeError, r"no skill 'nope' in this generation \(offered: "
                                                        "code-review, maintenance, workspace\\)"):
                s.nope
            with self.assertRaises(AttributeError):
                s.get("nope")
            self.assertFalse(hasattr(s, "__wrapped__"))

    def test_read_once(self):
        with self.skill_file() as s:
            self.assertEqual(s.revision, "sha256:5k1115")
            os.environ["KLBR_SKILLS_FILE"] = os.path.join(self.tmp, "other.json")
            self.assertEqual(s.revision, "sha256:5k1115")
            self.assertIs(s.workspace, s.workspace)

    def test_no_env_is_an_empty_set(self):
        with self.skill_file(path=False) as s:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                self.assertEqual(dir(s), [])
                self.assertEqual((s.revision, s.roots, s.refused), ("", [], {}))

    def test_missing_file_is_an_empty_set_with_a_warning(self):
        with self.skill_file(path=os.path.join(self.tmp, "gone.json")) as s:
            with self.assertWarnsRegex(RuntimeWarning, "could not be read"):
                self.assertEqual(dir(s), [])
            self.assertEqual(s.revision, "")
            with self.assertRaisesRegex(AttributeError, "could not be read"):
                s.workspace

    def test_malformed_file_is_an_empty_set_with_a_warning(self):
        for raw in ("{not json", "[]", json.dumps({"skills": {"a": 1}}), json.dumps({"roots": "x"}),
                    json.dumps({"revision": 3})):
            with self.subTest(raw=raw):
                with self.skill_file(raw=raw) as s:
                    with self.assertWarns(RuntimeWarning):
                        self.assertEqual(dir(s), [])

    def test_partial_payload(self):
        with self.skill_file({"skills": {"a": "# a\n"}}) as s:
            self.assertEqual((dir(s), s.revision, s.roots, s.refused), (["a"], "", [], {}))


class SkillsInTheWorkbenchTest(SkillsCase):
    def test_help_in_a_cell(self):
        path = os.path.join(self.tmp, "skills.json")
        with open(path, "w") as f:
            json.dump(PAYLOAD, f)
        w = peer.Worker(workspace=self.tmp, env={"KLBR_SKILLS_FILE": path}).start()
        self.addCleanup(w.close)
        # Nothing is read or compiled at start: the prelude binds cheap modules.
        outcome, _, _ = w.execute("import sys, klbr.skills\n('klbr._behavior' in sys.modules, klbr.skills._set)")
        self.assertEqual(outcome["value"], "(False, None)")
        outcome, out, _ = w.execute("import klbr.skills as sk\nhelp(sk.workspace)\n(sk is skills, dir(skills), skills.revision)")
        self.assertEqual(outcome["status"], "ok", outcome)
        self.assertEqual(outcome["value"], "(True, ['code-review', 'maintenance', 'workspace'], 'sha256:5k1115')")
        text = peer.text_of(out)
        self.assertIn("Look before you change", text)
        self.assertIn("Start narrow", text)
        outcome, _, _ = w.execute("skills.discord")
        self.assertEqual(outcome["status"], "error")
        self.assertEqual(outcome["error"]["type"], "AttributeError")
        self.assertIn("refused", outcome["error"]["message"])


if __name__ == "__main__":
    unittest.main()
