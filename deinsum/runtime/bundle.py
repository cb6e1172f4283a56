"""The runtime inside an emitted script: its modules as one payload, imported from the script itself.

Standard library only. A script carries this file verbatim, the payload (the package files of
``deinsum.emit.RUNTIME`` byte for byte, bzip2-compressed, in base 93: ``deinsum.emit.pack``) and a call of
:func:`install`; its imports then find the runtime as the package named by the payload's hash (two scripts, or
an installed deinsum, never mix). Tracebacks name each module's file in the package and its line.
"""
import bz2
import functools
import hashlib
import importlib.abc
import importlib.util
import linecache
import sys

#: The payload's digits, the 93 printable ASCII characters a "..." literal holds as they are: 49 per 40 bytes.
DIGITS = "".join(chr(c) for c in range(32, 127) if chr(c) not in '"\\')


def unpack(payload):
    """The ``{path: text}`` files of a payload."""
    value, data = {c: d for d, c in enumerate(DIGITS)}, bytearray()
    for k in range(0, len(payload), 49):
        data += functools.reduce(lambda n, c: n * 93 + value[c], payload[k:k + 49], 0).to_bytes(40, "big")
    parts = bz2.BZ2Decompressor().decompress(data).decode().split("\0")   # (up to the stream's end)
    return dict(zip(parts[1::2], parts[2::2]))


class Bundle(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads the modules of a payload as the package ``name``: ``name.errors`` from ``errors.py``,
    ``name.runtime.kernels`` from ``runtime/kernels.py``; a folder is a package (its ``__init__.py``, if any)."""

    def __init__(self, name, files, origin):
        self.name, self.origin = name, origin
        self.sources = {}
        for path, text in files.items():
            parts = path[:-len(".py")].split("/")
            module = ".".join([name] + (parts[:-1] if parts[-1] == "__init__" else parts))
            self.sources[module] = (path, text, parts[-1] == "__init__")
            for depth in range(1, len(parts)):                  # every folder on the way is a package
                self.sources.setdefault(".".join([name] + parts[:depth]), ("/".join(parts[:depth]), "", True))
        self.sources.setdefault(name, ("", "", True))

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.sources:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=self.sources[fullname][2])

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        path, text, _ = self.sources[module.__name__]
        filename = f"{self.origin}/deinsum/{path or '__init__.py'}"
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)   # source in tracebacks
        module.__file__ = filename
        exec(compile(text, filename, "exec"), module.__dict__)


def package_name(payload):
    """The name of the package a payload's modules are imported as: ``deinsum_`` and 12 hex digits of its hash."""
    return "deinsum_" + hashlib.sha256(payload.encode("ascii")).hexdigest()[:12]


def install(payload, origin="embedded"):
    """Make the payload's modules importable (once per process and payload, whichever script installed it) and
    return their package's name."""
    name = package_name(payload)
    if not any(getattr(f, "name", None) == name for f in sys.meta_path):
        sys.meta_path.insert(0, Bundle(name, unpack(payload), origin))
    return name
