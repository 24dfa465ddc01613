#!/usr/bin/env python3
"""eval.tasks through the daemon over loopback HTTP: bad entries are 400s
naming the field (a path outside model_roots, a task file with a bad line,
a name used twice), and a job with two tasks and distillation reports, for
every arm, tasks.NAME = {acc, acc_norm, n, stderr} after distillation and
tasks_pruned.NAME before it, the exported arm's figures agreeing with
`autocompress tasks` run on the exported checkpoint and the model card
showing them."""
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, DATA, ROOT, check_report_page, job_curves, run_with_daemon, same_curve, spec  # noqa: E402

D = None
DIST = {"tokens": 2048, "seq_len": 32, "batch": 4, "lr": 0.001}


def task_files():
    fort = os.path.join(D.dir, "fortunes.jsonl")
    if not os.path.exists(fort):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_fortune_task.py"), "--text",
                        os.path.join(DATA, "heldout.txt"), "--out", fort, "--n", "60"], check=True, capture_output=True)
    tiny = os.path.join(D.dir, "tiny-mc.jsonl")
    with open(tiny, "w") as f:
        f.write(json.dumps({"context": "A penny saved is a penny", "choices": ["earned.", "lost."], "gold": 0}) + "\n")
        f.write(json.dumps({"contexts": ["The cat sat on the mat because the cat",
                                         "The cat sat on the mat because the mat"],
                            "continuation": "was tired.", "gold": 0}) + "\n")
    return fort, tiny


def test_bad_task_entries():
    fort, tiny = task_files()
    badline = os.path.join(D.dir, "bad.jsonl")
    with open(badline, "w") as f:
        f.write('{"context": "a", "choices": ["b", "c"], "gold": 0}\n{"context": "a", "choices": ["b"], "gold": 3}\n')
    cases = [
        ([{"name": "x", "path": "/etc/passwd"}], "invalid_path", "eval.tasks[0].path", None),
        ([{"name": "x", "path": fort}, {"name": "y", "path": os.path.join(D.dir, "none.jsonl")}], "invalid_path",
         "eval.tasks[1].path", None),
        ([{"name": "x", "path": badline}], "invalid_spec", "eval.tasks[0].path", "line 2: gold 3"),
        ([{"name": "x", "path": fort}, {"name": "x", "path": tiny}], "invalid_spec", "eval.tasks[1].name", None),
        ([{"name": "x y", "path": fort}], "invalid_spec", "eval.tasks[0].name", None),
        ([{"path": fort}], "invalid_spec", "eval.tasks[0].name", None),
    ]
    for tasks, code, field, msg in cases:
        st, r = D.req("POST", "/v1/jobs", body=spec(eval={"ctx": 64, "windows": 4, "tasks": tasks}))
        assert st == 400 and r["error"]["code"] == code and r["error"]["field"] == field, (tasks, st, r)
        assert msg is None or msg in r["error"]["message"], r


def check_score(t, n):
    assert set(t) >= {"acc", "acc_norm", "n", "stderr"} and t["n"] == n, t
    # the sample standard error of a 0/1 mean: sqrt(p (1 - p) / (n - 1))
    assert abs(t["stderr"] - math.sqrt(t["acc"] * (1 - t["acc"]) / (n - 1))) < 1e-9, t


def test_job_reports_tasks_for_every_arm():
    fort, tiny = task_files()
    out = os.path.join(D.dir, "out")
    body = spec(output=out, distill=DIST,
                eval={"ctx": 64, "windows": 4, "tasks": [{"name": "fortunes", "path": fort},
                                                         {"name": "tiny", "path": tiny}]},
                minitron={"score": "task", "task": "fortunes"})
    st, j = D.req("POST", "/v1/jobs", body=body)
    assert st == 201, j
    j = D.wait_state(j["id"], {"succeeded", "failed"}, timeout=300)
    assert j["state"] == "succeeded", j
    st, res = D.req("GET", f"/v1/jobs/{j['id']}/result")
    assert st == 200, res
    # the choice says the accuracies did not decide it
    assert res["chosen_reason"].endswith("; task accuracy is reported, not weighed (held-out loss decides, a tie goes "
                                         "to the method's arm)"), res["chosen_reason"]
    for arm in ("baseline", "minitron", "autocompress"):
        a = res[arm]
        check_score(a["tasks"]["fortunes"], 60)
        check_score(a["tasks"]["tiny"], 2)
        if arm == "baseline":
            assert "tasks_pruned" not in a, a.keys()
        else:
            check_score(a["tasks_pruned"]["fortunes"], 60)
            check_score(a["tasks_pruned"]["tiny"], 2)
    # minitron.score task: Minitron's top-k candidates scored by the fortune task's accuracy, the highest kept
    # (the first of equals, as Model-Optimizer's max over its score_func)
    mt = res["minitron"]
    assert mt["score"] == {"task": "fortunes", "metric": "acc"}, mt["score"]
    accs = [c["task_acc"] for c in mt["candidates"]]
    assert all(c["task_n"] == 60 and "calib_nll" not in c for c in mt["candidates"]), mt["candidates"][0]
    assert mt["best_candidate"] == accs.index(max(accs)), (mt["best_candidate"], accs)
    # the base model is scored above chance on the fortune task
    assert res["baseline"]["tasks"]["fortunes"]["acc"] > 0.25, res["baseline"]["tasks"]
    # the exported checkpoint, scored apart by the CLI, gives the chosen arm's figures
    p = subprocess.run([os.path.join(BUILD, "autocompress"), "tasks", out, fort], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    cli = json.loads(p.stdout)["fortunes"]
    rep = res[res["chosen"]]["tasks"]["fortunes"]
    assert abs(cli["acc"] - rep["acc"]) <= 1 / 60 + 1e-9 and abs(cli["acc_norm"] - rep["acc_norm"]) <= 1 / 60 + 1e-9, \
        (cli, rep)
    with open(os.path.join(out, "report.json")) as f:
        assert json.load(f)[res["chosen"]]["tasks"] == res[res["chosen"]]["tasks"]
    # the model card's task table: a column per task, a row per arm, the chosen arm's figures in it
    card = open(os.path.join(out, "README.md")).read()
    assert "| fortunes (n = 60) | tiny (n = 2) |" in card, card
    assert f"{rep['acc']:.3f}, {rep['acc_norm']:.3f} +- {rep['stderr']:.3f} (" in card, card
    # report.html (the job's own file, and the daemon's copy, the same page): the task table (check_report_page
    # reads each cell against the result) and a distillation curve per arm through its distill events
    with open(os.path.join(out, "report.html")) as f:
        own = f.read()
    st, page = D.req("GET", f"/v1/jobs/{j['id']}/report.html")
    assert st == 200 and page == own
    t = check_report_page(own, res)
    assert {"tasks", "limits", "quality"} <= set(t.tables), list(t.tables)
    search, distill, label = job_curves(D, j["id"])
    assert sorted(distill) == ["autocompress", "minitron"] and same_curve(t.curves[label], search), list(t.curves)
    for arm, pts in distill.items():
        assert len(pts) >= 2 and pts[-1][0] == res[arm]["distill"]["steps"], (arm, pts[-1], res[arm]["distill"])
        assert same_curve(t.curves[f"distillation loss, {arm} arm"], pts), arm
    print(f"   fortunes acc: base {res['baseline']['tasks']['fortunes']['acc']:.3f}, "
          f"minitron {res['minitron']['tasks_pruned']['fortunes']['acc']:.3f} -> "
          f"{res['minitron']['tasks']['fortunes']['acc']:.3f}, autocompress "
          f"{res['autocompress']['tasks_pruned']['fortunes']['acc']:.3f} -> "
          f"{res['autocompress']['tasks']['fortunes']['acc']:.3f}")


if __name__ == "__main__":
    run_with_daemon([test_bad_task_entries, test_job_reports_tasks_for_every_arm], globals())
