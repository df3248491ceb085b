"""The protocol over a pipe pair, as klbr-kernel --protocol-stdio hands it to
the worker on a worker host: frames in on KLBR_PROTOCOL_FD, out on
KLBR_PROTOCOL_OUT_FD."""

import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

from .peer import GENERATION, SESSION, SRC, encode


def read_frame(fd):
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise EOFError(f"stream ended after {len(buf)} of {n} bytes")
            buf += chunk
        return buf
    (n,) = struct.unpack(">I", exact(4))
    return json.loads(exact(n))


class PipePairTest(unittest.TestCase):
    def test_cell_round_trip_over_a_pipe_pair(self):
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": SRC, "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONSAFEPATH": "1",
            "KLBR_ROLE": "workbench", "KLBR_SESSION": SESSION, "KLBR_GENERATION": str(GENERATION),
            "KLBR_WORKSPACE": os.getcwd(),
            "KLBR_PROTOCOL_FD": str(to_worker_r), "KLBR_PROTOCOL_OUT_FD": str(from_worker_w),
        }
        with tempfile.TemporaryFile() as stderr:
            proc = subprocess.Popen([sys.executable, "-s", "-m", "klbr_runtime"], env=env,
                                    stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
                                    pass_fds=(to_worker_r, from_worker_w))
            os.close(to_worker_r)
            os.close(from_worker_w)
            try:
                hello = read_frame(from_worker_r)
                self.assertEqual(hello["type"], "hello")
                os.write(to_worker_w, encode({"v": 1, "type": "execute", "session": SESSION,
                                              "generation": GENERATION, "execution": "e1",
                                              "code": "import os\nx = 1\nx + 1"}))
                while True:
                    f = read_frame(from_worker_r)
                    if f["type"] == "outcome":
                        break
                self.assertEqual((f["execution"], f["status"], f.get("value")), ("e1", "ok", "2"))
                # The end of the stream in is the end of the worker, and its end
                # of the stream out is then closed: no child kept either open.
                os.close(to_worker_w)
                self.assertEqual(proc.wait(10), 0)
                self.assertEqual(os.read(from_worker_r, 1), b"")
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                os.close(from_worker_r)
                stderr.seek(0)
                diag = stderr.read().decode(errors="replace")
            self.assertNotIn("Traceback", diag)


if __name__ == "__main__":
    unittest.main()
