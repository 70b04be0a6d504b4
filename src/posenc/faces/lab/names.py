"""The lab's task and encoding names, importable without torch (the command line lists them)."""

TASKS = ("copy", "reverse", "sort", "recall", "addition", "text")

ENCODINGS = (
    "nope",
    "sinusoidal",
    "learned",
    "rope",
    "rope-linear",
    "rope-ntk",
    "rope-yarn",
    "xpos",
    "alibi",
    "t5",
    "kerple",
    "fire",
    "sandwich",
    "randomized",
)
