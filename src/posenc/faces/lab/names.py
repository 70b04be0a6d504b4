"""The lab's task and encoding names, importable without torch (the command line lists them)."""

from posenc.faces.lab.encodings import ENCODINGS

__all__ = ["ENCODINGS", "TASKS"]

TASKS = ("copy", "reverse", "sort", "recall", "addition", "text")
