"""
The one part of the package that is not pure Python: the compiled core of
the broker's ZeroMQ I/O (``malamute_pack/transport/_zmqcore.c``, linked
against libzmq). It is optional: on a machine without a C compiler or
libzmq's headers the build says so and goes on, and the package runs its
pure-Python twin (``malamute_pack/transport/zmqcore.py``), which the
broker's start-up log names. Everything else is in ``pyproject.toml``.

Tests: ``tests/unit/test_transport_zmqcore.py``.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "malamute_pack.transport._zmqcore",
            ["malamute_pack/transport/_zmqcore.c"],
            libraries=["zmq"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
