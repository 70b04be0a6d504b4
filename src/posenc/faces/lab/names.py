"""The lab's task and encoding names, importable without torch (the command line lists them)."""

from dataclasses import dataclass

from posenc.faces.lab.encodings import ENCODINGS as ENCODINGS

#: The tasks of Kazemnejad et al. (2023)'s length-generalisation suite that the lab's
#: first tasks do not already cover (:mod:`posenc.lab.suite_tasks` makes them).
SUITE_TASKS = (
    "copy-repeat", "copy-replace", "copy-repeat-2x", "copy-2x",
    "reverse-2x", "reverse-copy",
    "addition-msd", "summation", "parity", "lego", "sort-multidigit", "polynomial",
    "scan",
)  # fmt: skip

#: The arithmetic formats of the length-generalisation papers
#: (:data:`posenc.lab.arithmetic_tasks.FORMATS` defines them).
ARITHMETIC_TASKS = (
    "add-reversed", "add-reversed-hints", "add-unpadded", "add-answer-reversed", "add-3",
    "multiply-nx2",
)  # fmt: skip

#: Every task of the lab (``posenc lab run --task``): its own, the suite's, Liu et al.
#: (2023)'s flip-flop language (:mod:`posenc.lab.flipflop`), passkey retrieval
#: (:mod:`posenc.lab.passkey`) and the arithmetic formats; each synthetic one is an entry
#: of :data:`posenc.lab.tasks.SYNTHETIC`.
TASKS = (
    "copy", "reverse", "sort", "recall", "addition", "text", *SUITE_TASKS, "flipflop",
    "passkey", *ARITHMETIC_TASKS,
)  # fmt: skip


@dataclass(frozen=True)
class SuiteTask:
    """One task of the suite and its length split.

    Attributes:
        task: The lab's task name (one of :data:`TASKS`).
        label: The paper's name for it.
        measure: What the task length ``n`` counts.
        train_len: Train on lengths up to this (the reference's ``train_max``).
        test_len: Test on lengths ``train_len + 1 .. test_len``.
        train_min: The reference's shortest training length (its builders' ``train_min``);
            the lab trains from 1.
        split: The reference's ``(dataset, split)`` names.
    """

    task: str
    label: str
    measure: str
    train_len: int
    test_len: int
    train_min: int
    split: tuple[str, str]


#: Every task of the suite (McGill-NLP/length-generalization's final runs, without
#: PCFG): copy and reverse variants train to 20 and test 21 .. 40, the mathematical and
#: reasoning tasks train to 8 and test 9 .. 16, SCAN trains to 25 actions and tests 26 ..
#: 48 (the reference re-splits SCAN at 25; SCAN's own length split is 22 / 24 .. 48, and
#: some lengths have no command: :data:`posenc.lab.suite_tasks.SCAN_LENGTHS`).
SUITE = (
    SuiteTask("copy", "Copy", "symbols", 20, 40, 4, ("s2s_copy", "cmc_tr20_ts40")),
    SuiteTask("copy-2x", "Copy (2x)", "symbols", 20, 40, 4, ("s2s_copy", "cmc2x_tr20_ts40")),
    SuiteTask("copy-repeat", "Copy (Repeat)", "symbols", 20, 40, 4,
              ("s2s_copy", "rsc_tr20_ts40")),
    SuiteTask("copy-repeat-2x", "Copy (Repeat 2x)", "symbols", 20, 40, 4,
              ("s2s_copy", "rsc2x_tr20_ts40")),
    SuiteTask("copy-replace", "Copy (Repeat+Change)", "symbols", 20, 40, 4,
              ("s2s_copy", "rdc_tr20_ts40")),
    SuiteTask("reverse", "Reverse", "symbols", 20, 40, 4, ("s2s_reverse", "mc_tr20_ts40")),
    SuiteTask("reverse-2x", "Reverse (2x)", "symbols", 20, 40, 4,
              ("s2s_reverse", "mc2x_tr20_ts40")),
    SuiteTask("reverse-copy", "Reverse+Copy", "symbols", 20, 40, 4,
              ("s2s_reverse", "mcrv_tr20_ts40")),
    SuiteTask("addition-msd", "Addition", "digits of the longer operand", 8, 16, 4,
              ("s2s_addition", "len_tr8_ts16")),
    SuiteTask("summation", "Summation", "numbers", 8, 16, 4, ("s2s_sum", "len_tr8_ts16")),
    SuiteTask("parity", "Parity", "bits", 8, 16, 3, ("s2s_parity", "len_tr8_ts16")),
    SuiteTask("lego", "LEGO", "variables", 8, 16, 4, ("s2s_lego", "len_tr8_ts16")),
    SuiteTask("sort", "Sort (Single Token)", "numbers", 8, 16, 4,
              ("s2s_sort", "len_sngd_tr8_ts16")),
    SuiteTask("sort-multidigit", "Sort (Multi Digit)", "numbers", 8, 16, 4,
              ("s2s_sort", "len_mltd_tr8_ts16")),
    SuiteTask("polynomial", "Polynomial Eval.", "terms", 8, 16, 4,
              ("s2s_poly", "n_terms_tr8_ts16")),
    SuiteTask("scan", "SCAN", "actions", 25, 48, 1, ("scan", "mdlen_tr25_ts48")),
)  # fmt: skip
