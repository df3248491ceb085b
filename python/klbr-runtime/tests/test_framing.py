import io
import json
import os
import socket
import struct
import sys
import threading
import unittest

sys.dont_write_bytecode = True  # keep src/ free of __pycache__ (klbr-core embeds the tree)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from klbr_runtime import framing  # noqa: E402
from klbr_runtime.framing import (  # noqa: E402
    MAX_FRAME, FrameEncodingError, FrameError, FrameJSONError, FrameLengthError, FrameNotObjectError,
    FrameReader, FrameWriter, TruncatedFrameError, decode_body, encode_frame,
)


def raw(body):
    return struct.pack(">I", len(body)) + body


def reader_over(data, chunk=None):
    buf = io.BytesIO(data)
    if chunk is None:
        return FrameReader(buf.read)
    return FrameReader(lambda n: buf.read(min(n, chunk)))


class EncodeTest(unittest.TestCase):
    def test_round_trip(self):
        obj = {"v": 1, "type": "output", "data": "héllo \x00 \u2028 🎉", "n": [1, 2.5, None, True]}
        data = encode_frame(obj)
        (n,) = struct.unpack(">I", data[:4])
        self.assertEqual(n, len(data) - 4)
        self.assertEqual(json.loads(data[4:].decode("utf-8")), obj)
        self.assertEqual(reader_over(data).read_frame(), obj)

    def test_compact_utf8(self):
        data = encode_frame({"a": "é"})
        self.assertEqual(data[4:], '{"a":"é"}'.encode("utf-8"))

    def test_lone_surrogate_is_escaped_not_invalid_utf8(self):
        data = encode_frame({"data": "x\udcffy"})
        data[4:].decode("utf-8")  # valid UTF-8 (ASCII with \u escapes)
        self.assertEqual(reader_over(data).read_frame(), {"data": "x\udcffy"})

    def test_oversized_body_is_refused(self):
        with self.assertRaises(FrameLengthError):
            encode_frame({"data": "x" * MAX_FRAME})
        self.assertTrue(issubclass(FrameLengthError, ValueError))

    def test_exactly_max_is_allowed(self):
        overhead = len(json.dumps({"d": ""}, separators=(",", ":")))
        data = encode_frame({"d": "x" * (MAX_FRAME - overhead)})
        self.assertEqual(len(data) - 4, MAX_FRAME)
        self.assertEqual(len(reader_over(data).read_frame()["d"]), MAX_FRAME - overhead)

    def test_nan_and_non_json_are_refused(self):
        with self.assertRaises(ValueError):
            encode_frame({"x": float("nan")})
        with self.assertRaises(TypeError):
            encode_frame({"x": {1, 2}})
        with self.assertRaises(TypeError):
            encode_frame([1, 2])


class ReadMalformedTest(unittest.TestCase):
    def assertFrameError(self, data, kind, chunk=None):
        with self.assertRaises(kind) as cm:
            reader_over(data, chunk).read_frame()
        self.assertIsInstance(cm.exception, FrameError)
        self.assertTrue(str(cm.exception))  # a diagnostic, not an empty message
        return cm.exception

    def test_zero_length(self):
        self.assertFrameError(b"\x00\x00\x00\x00{}", FrameLengthError)

    def test_oversized_length_is_refused_before_the_body(self):
        reads = []
        data = struct.pack(">I", MAX_FRAME + 1) + b"{" * 10

        def read(n):
            reads.append(n)
            return data[:4] if len(reads) == 1 else b""

        with self.assertRaises(FrameLengthError):
            FrameReader(read).read_frame()
        self.assertEqual(len(reads), 1)

    def test_huge_length(self):
        self.assertFrameError(b"\xff\xff\xff\xff", FrameLengthError)

    def test_truncated_header(self):
        self.assertFrameError(b"\x00\x00", TruncatedFrameError)

    def test_truncated_body(self):
        self.assertFrameError(struct.pack(">I", 10) + b'{"a":', TruncatedFrameError)

    def test_truncated_after_a_good_frame(self):
        r = reader_over(raw(b'{"a":1}') + b"\x00\x00\x00\x05{")
        self.assertEqual(r.read_frame(), {"a": 1})
        with self.assertRaises(TruncatedFrameError):
            r.read_frame()

    def test_invalid_utf8(self):
        self.assertFrameError(raw(b'{"a":"\xff\xfe"}'), FrameEncodingError)

    def test_overlong_and_surrogate_utf8(self):
        self.assertFrameError(raw(b'{"a":"\xc0\xaf"}'), FrameEncodingError)
        self.assertFrameError(raw(b'{"a":"\xed\xa0\x80"}'), FrameEncodingError)

    def test_invalid_json(self):
        self.assertFrameError(raw(b'{"a":'), FrameJSONError)
        self.assertFrameError(raw(b"{'a': 1}"), FrameJSONError)

    def test_trailing_data(self):
        self.assertFrameError(raw(b'{"a":1} {"b":2}'), FrameJSONError)

    def test_deep_nesting(self):
        self.assertFrameError(raw(b'{"a":' + b"[" * 200000 + b"]" * 200000 + b"}"), FrameJSONError)

    def test_not_an_object(self):
        for body in (b"[1,2]", b'"text"', b"42", b"null", b"true"):
            with self.subTest(body=body):
                self.assertFrameError(raw(body), FrameNotObjectError)

    def test_bom_is_not_json(self):
        self.assertFrameError(raw(b'\xef\xbb\xbf{"a":1}'), FrameJSONError)

    def test_decode_body_directly(self):
        self.assertEqual(decode_body(b'{"x":[1]}'), {"x": [1]})
        with self.assertRaises(FrameNotObjectError):
            decode_body(b"[]")


class ReadStreamTest(unittest.TestCase):
    def test_clean_eof_is_none(self):
        self.assertIsNone(reader_over(b"").read_frame())
        r = reader_over(raw(b'{"a":1}'))
        self.assertEqual(r.read_frame(), {"a": 1})
        self.assertIsNone(r.read_frame())

    def test_many_frames_in_one_read_and_byte_by_byte(self):
        frames = [{"i": i, "s": "x" * i} for i in range(50)]
        data = b"".join(encode_frame(f) for f in frames)
        for chunk in (None, 1, 3, 7):
            with self.subTest(chunk=chunk):
                r = reader_over(data, chunk)
                self.assertEqual([r.read_frame() for _ in frames], frames)
                self.assertIsNone(r.read_frame())

    def test_frame_lookalike_inside_a_string_is_data(self):
        fake = raw(b'{"v":1,"type":"outcome"}').decode("latin-1")
        data = encode_frame({"type": "output", "data": fake})
        r = reader_over(data)
        self.assertEqual(r.read_frame()["data"], fake)
        self.assertIsNone(r.read_frame())


class WriterTest(unittest.TestCase):
    def test_concurrent_writes_never_interleave(self):
        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        w = FrameWriter(a.fileno())
        per_thread, threads = 200, 8
        payload = "y" * 5000

        def writer(t):
            for i in range(per_thread):
                w.write({"t": t, "i": i, "p": payload})

        got = []

        def reader():
            r = FrameReader(b.recv)
            for _ in range(per_thread * threads):
                got.append(r.read_frame())

        rt = threading.Thread(target=reader)
        rt.start()
        ts = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        rt.join(30)
        self.assertEqual(len(got), per_thread * threads)
        for t in range(threads):
            self.assertEqual([f["i"] for f in got if f["t"] == t], list(range(per_thread)))
        self.assertTrue(all(f["p"] == payload for f in got))

    def test_write_all_handles_partial_writes(self):
        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        big = encode_frame({"d": "z" * (900 * 1024)})  # larger than the socket buffer
        received = []
        t = threading.Thread(target=lambda: received.append(FrameReader(b.recv).read_frame()))
        t.start()
        framing.write_all(a.fileno(), big)
        t.join(10)
        self.assertEqual(len(received[0]["d"]), 900 * 1024)


if __name__ == "__main__":
    unittest.main()
