"""The runtime inside an emitted script: its modules as one payload, imported from the script itself.

Standard library only. A script carries this file verbatim, the payload (the package files of
``deinsum.emit.RUNTIME`` byte for byte, bzip2-compressed, base85) and a call of :func:`install`; its imports
then find the runtime as the package named by the payload's hash (two scripts, or an installed deinsum,
never mix). Tracebacks name each module's file in the package and its line.

>>> payload = pack({"errors.py": "X = 1\\n"})
>>> package = install(payload)
>>> __import__(package + ".errors", fromlist=["X"]).X
1
"""
import base64
import bz2
import hashlib
import importlib.abc
import importlib.util
import json
import linecache
import sys


def pack(files):
    """``{path under deinsum/: text}`` as a payload (text): the texts' lengths (JSON), a newline, the texts."""
    data = json.dumps({path: len(text) for path, text in files.items()}) + "\n" + "".join(files.values())
    return base64.b85encode(bz2.compress(data.encode(), 9)).decode("ascii")   # 3% below LZMA's on this text


def unpack(payload):
    """The ``{path: text}`` files of a payload."""
    lengths, _, texts = bz2.decompress(base64.b85decode(payload)).decode().partition("\n")
    files, at = {}, 0
    for path, n in json.loads(lengths).items():
        files[path], at = texts[at:at + n], at + n
    return files


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
    """Make the payload's modules importable (once per payload) and return their package's name."""
    name = package_name(payload)
    if not any(isinstance(f, Bundle) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, Bundle(name, unpack(payload), origin))
    return name
