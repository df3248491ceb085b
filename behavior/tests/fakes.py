"""Fake effects for running hooks in tests.

Hooks decide; they never act. ``no_effects()`` stands in for the host while a
hook runs: the ``klbr`` SDK is replaced by a fake whose every use is recorded
and refused (in the real hook worker, host requests raise NoExecutionScope),
and connecting a socket or starting a process is refused too. A test then checks
that nothing was attempted.
"""

import contextlib
import os
import socket
import subprocess
import sys
import types
from unittest import mock


class EffectAttempted(AssertionError):
    pass


class FakeSDK(types.ModuleType):
    """A ``klbr`` module that records and refuses every attribute use."""

    def __init__(self, name, attempts):
        super().__init__(name)
        self.__dict__["_attempts"] = attempts

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._attempts.append(f"{self.__name__}.{attr}")
        raise EffectAttempted(f"a hook used {self.__name__}.{attr}: hooks have no effect scope")


@contextlib.contextmanager
def no_effects():
    """Yield the list of attempted effects (empty when the hook behaved)."""
    attempts = []

    def refuse(what):
        def _refused(*args, **kwargs):
            attempts.append(what)
            raise EffectAttempted(f"a hook tried {what}")
        return _refused

    fakes = {name: FakeSDK(name, attempts)
             for name in ("klbr", "klbr.host", "klbr.local", "klbr.runtime", "klbr.workspace",
                          "klbr.behavior", "klbr.hooks", "klbr.skills")}
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(sys.modules, fakes))
        # Connecting is the effect; creating a socket is not (an event loop
        # makes itself a socketpair).
        stack.enter_context(mock.patch.object(socket.socket, "connect", refuse("socket.connect")))
        stack.enter_context(mock.patch.object(socket.socket, "connect_ex",
                                              refuse("socket.connect_ex")))
        stack.enter_context(mock.patch.object(socket.socket, "sendto", refuse("socket.sendto")))
        stack.enter_context(mock.patch.object(socket, "create_connection",
                                              refuse("socket.create_connection")))
        stack.enter_context(mock.patch.object(subprocess, "Popen", refuse("subprocess.Popen")))
        stack.enter_context(mock.patch.object(os, "system", refuse("os.system")))
        yield attempts
