#!/usr/bin/env python3
"""tools/mc2jsonl.py on hand-written records of each layout: the prompt
lm-evaluation-harness builds for it (written out here from its task
configs), the gold index, JSON array and JSONL input, a bad record named by
its line; and the converted files read by `autocompress tasks`."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, ROOT, TINY, Runner  # noqa: E402

TOOL = os.path.join(ROOT, "tools", "mc2jsonl.py")
WORK = tempfile.mkdtemp(prefix="ac_mc2jsonl_")

CASES = {
    "hellaswag": (
        [{"activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over the snow covering the window "
          "of a car, and a woman wearing winter clothes smiles.", "ctx_b": "then",
          "endings": [", the man adds wax to the windshield and cuts it.", ", a person board a ski lift.",
                      ", the man puts on a christmas coat, knitted with netting.",
                      ", the man continues removing the snow on his car."], "label": "3"},
         # the harness strips before it drops "[step]", so that choice keeps a leading space
         {"activity_label": "Home and Garden", "ctx_a": "[header] How to grow a tree [title] Dig a hole.",
          "ctx_b": "", "endings": ["[step] Water it.", "Sing  loudly."], "label": 0}],
        [{"context": "Removing ice from car: Then, the man writes over the snow covering the window of a car, and a "
          "woman wearing winter clothes smiles. Then",
          "choices": [", the man adds wax to the windshield and cuts it.", ", a person board a ski lift.",
                      ", the man puts on a christmas coat, knitted with netting.",
                      ", the man continues removing the snow on his car."], "gold": 3},
         {"context": "Home and Garden: How to grow a tree. Dig a hole.", "choices": [" Water it.", "Sing loudly."],
          "gold": 0}]),
    "arc": (
        [{"id": "Mercury_7175875", "question": "An astronomer observes that a planet rotates faster after a meteorite "
          "impact. Which is the most likely effect of this increase in rotation?",
          "choices": {"text": ["Planetary density will decrease.", "Planetary years will become longer.",
                               "Planetary days will become shorter.", "Planetary gravity will become stronger."],
                      "label": ["A", "B", "C", "D"]}, "answerKey": "C"},
         {"question": {"stem": "Which is a mammal?", "choices": [{"text": "trout", "label": "1"},
                                                                  {"text": "whale", "label": "2"}]},
          "answerKey": "2"}],
        [{"context": "Question: An astronomer observes that a planet rotates faster after a meteorite impact. Which is "
          "the most likely effect of this increase in rotation?\nAnswer:",
          "choices": ["Planetary density will decrease.", "Planetary years will become longer.",
                      "Planetary days will become shorter.", "Planetary gravity will become stronger."], "gold": 2},
         {"context": "Question: Which is a mammal?\nAnswer:", "choices": ["trout", "whale"], "gold": 1}]),
    "piqa": (
        [{"goal": "How do I ready a guinea pig cage for it's new occupants?",
          "sol1": "Provide the guinea pig with a cage full of a few inches of bedding made of ripped paper strips.",
          "sol2": "Provide the guinea pig with a cage full of a few inches of bedding made of ripped jeans material.",
          "label": 0}],
        [{"context": "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:",
          "choices": ["Provide the guinea pig with a cage full of a few inches of bedding made of ripped paper "
                      "strips.", "Provide the guinea pig with a cage full of a few inches of bedding made of ripped "
                      "jeans material."], "gold": 0}]),
    "winogrande": (
        [{"sentence": "Sarah was a much better surgeon than Maria so _ always got the harder cases.",
          "option1": "Sarah", "option2": "Maria", "answer": "1"},
         {"sentence": "The trophy doesn't fit into the brown suitcase because the _ is too large.",
          "option1": "trophy", "option2": "suitcase", "answer": "1"}],
        [{"contexts": ["Sarah was a much better surgeon than Maria so Sarah",
                       "Sarah was a much better surgeon than Maria so Maria"],
          "continuation": "always got the harder cases.", "gold": 0},
         {"contexts": ["The trophy doesn't fit into the brown suitcase because the trophy",
                       "The trophy doesn't fit into the brown suitcase because the suitcase"],
          "continuation": "is too large.", "gold": 0}]),
    "mmlu": (
        [{"question": "  What is the embryological origin of the hyoid bone?\n", "subject": "anatomy",
          "choices": ["The first pharyngeal arch", "The first and second pharyngeal arches",
                      "The second pharyngeal arch", "The second and third pharyngeal arches"], "answer": 3},
         {"question": "Find the degree of Q(sqrt(2)) over Q.", "subject": "abstract_algebra",
          "choices": ["0", "4", "2", "6"], "answer": "C"}],
        [{"context": "The following are multiple choice questions (with answers) about anatomy.\n\nWhat is the "
          "embryological origin of the hyoid bone?\nA. The first pharyngeal arch\nB. The first and second "
          "pharyngeal arches\nC. The second pharyngeal arch\nD. The second and third pharyngeal arches\nAnswer:",
          "choices": ["A", "B", "C", "D"], "gold": 3},
         {"context": "The following are multiple choice questions (with answers) about abstract algebra.\n\nFind the "
          "degree of Q(sqrt(2)) over Q.\nA. 0\nB. 4\nC. 2\nD. 6\nAnswer:", "choices": ["A", "B", "C", "D"],
          "gold": 2}]),
}


def convert(layout, text, *extra):
    p = subprocess.run([sys.executable, TOOL, layout, "-", *extra], input=text, capture_output=True, text=True,
                       timeout=30)
    return p.returncode, [json.loads(l) for l in p.stdout.splitlines() if l.strip()], p.stderr


def test_each_layout_jsonl_and_json_array():
    for layout, (records, want) in CASES.items():
        rc, got, err = convert(layout, "".join(json.dumps(r) + "\n" for r in records))
        assert rc == 0 and got == want, (layout, err, got)
        rc, got, err = convert(layout, json.dumps(records, indent=1))
        assert rc == 0 and got == want, (layout, "array", err)


def test_bad_record_names_its_line():
    rec = CASES["piqa"][0][0]
    text = json.dumps(rec) + "\n\n" + json.dumps({"goal": "x", "sol1": "y"}) + "\n"
    rc, _, err = convert("piqa", text)
    assert rc != 0 and "line 3: not a piqa record" in err, err
    rc, _, err = convert("winogrande", json.dumps({"sentence": "no blank", "option1": "a", "option2": "b",
                                                   "answer": "1"}) + "\n")
    assert rc != 0 and "line 1" in err, err


def test_converted_files_are_scored():
    if not os.path.exists(os.path.join(TINY, "config.json")):
        return "skip: no tiny model (make tiny-model)"
    paths = []
    for layout, (records, _) in CASES.items():
        path = os.path.join(WORK, layout + ".jsonl")
        subprocess.run([sys.executable, TOOL, layout, "-", path], input="".join(json.dumps(r) + "\n" for r in records),
                       text=True, check=True, capture_output=True)
        paths.append(path)
    p = subprocess.run([os.path.join(BUILD, "autocompress"), "tasks", TINY, *paths], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    for layout, (records, _) in CASES.items():
        assert got[layout]["n"] == len(records), got


def main():
    r = Runner()
    try:
        for t in (test_each_layout_jsonl_and_json_array, test_bad_record_names_its_line, test_converted_files_are_scored):
            r.run(t)
    finally:
        subprocess.run(["rm", "-rf", WORK])
    r.done()


if __name__ == "__main__":
    main()
