"""klbr_runtime: the Python worker of klbr (roles ``workbench`` and ``hooks``).

Started by klbr-kernel as ``python -m klbr_runtime`` with the protocol socket on
``KLBR_PROTOCOL_FD`` (3). See docs/worker-protocol.md and the README next to
this package.
"""

PROTOCOL = 1
SDK_VERSION = "0.1.0"  # the version of the klbr SDK shipped beside this runtime
