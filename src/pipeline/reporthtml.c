/* reporthtml.c - see reporthtml.h. */
#include "pipeline/reporthtml.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "textout_int.h"

/* s, HTML-escaped (text and attribute values). */
static void esc(ac_text *o, const char *s) {
    for (; s && *s; s++) switch (*s) {
        case '&': ac_text_put(o, "&amp;"); break;
        case '<': ac_text_put(o, "&lt;"); break;
        case '>': ac_text_put(o, "&gt;"); break;
        case '"': ac_text_put(o, "&quot;"); break;
        case '\'': ac_text_put(o, "&#39;"); break;
        default: ac_text_put(o, "%c", *s);
        }
}

static const json_t *obj(const json_t *o, const char *k) { return json_object_get(o, k); }

static int has(const json_t *o, const char *k) { return json_is_number(json_object_get(o, k)); }

static const char *const ARMS[] = {"baseline", "minitron", "autocompress", "puzzle"};
enum { NARMS = 4 };

/* A figure in a cell: "—" when absent; parameters as integers. */
static void cell_num(ac_text *o, const json_t *v, const char *metric) {
    if (!json_is_number(v)) {
        ac_text_put(o, "<td>&mdash;</td>");
        return;
    }
    double x = json_number_value(v);
    if (metric && !strcmp(metric, "params"))
        ac_text_put(o, "<td class=\"n\">%.0f</td>", x);
    else
        ac_text_put(o, "<td class=\"n\">%.4g</td>", x);
}

static const char CSS[] =
    "body{font:14px/1.45 system-ui,sans-serif;color:#111827;margin:2em auto;max-width:1100px;padding:0 1em}"
    "h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #e5e7eb}"
    "table{border-collapse:collapse;margin:.6em 0}th,td{border:1px solid #d1d5db;padding:.25em .6em;text-align:left}"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}th.chosen{background:#dbeafe}"
    ".met{background:#dcfce7}.missed{background:#fee2e2;font-weight:600}.muted{color:#6b7280}"
    ".note{background:#fef3c7;padding:.4em .7em;border-left:4px solid #d97706}"
    "figure{display:inline-block;margin:.4em 1em .4em 0}figcaption{font-size:.9em;color:#374151}"
    ".k0{fill:#9ca3af}.k1{fill:#f59e0b}.k2{fill:#2563eb}.lk0{background:#9ca3af}.lk1{background:#f59e0b}"
    ".lk2{background:#2563eb}.k3{fill:#10b981}.lk3{background:#10b981}.key{display:inline-block;width:.9em;height:.9em;margin:0 .3em 0 1em}";

/* The arms present in the report, as indexes into ARMS. */
static int arms_present(const json_t *r, int idx[NARMS]) {
    int n = 0;
    for (int i = 0; i < NARMS; i++)
        if (json_is_object(obj(r, ARMS[i]))) idx[n++] = i;
    return n;
}

static void put_head_row(ac_text *o, const json_t *r, const char *first, const int *idx, int n) {
    const char *chosen = ac_jstr(r, "chosen");
    ac_text_put(o, "<tr><th>%s</th>", first);
    for (int i = 0; i < n; i++) {
        const char *a = ARMS[idx[i]];
        int c = !strcmp(a, chosen);
        ac_text_put(o, "<th%s>%s%s</th>", c ? " class=\"chosen\"" : "", a, c ? " (chosen, exported)" : "");
    }
    ac_text_put(o, "</tr>\n");
}

static void put_choice(ac_text *o, const json_t *r) {
    const char *chosen = ac_jstr(r, "chosen");
    const char *other = !strcmp(chosen, "autocompress") ? "minitron" : "autocompress";
    const json_t *a = obj(r, chosen), *b = obj(r, other);
    ac_text_put(o, "<p>Exported: the <b>");
    esc(o, chosen);
    ac_text_put(o, "</b> arm");
    if (ac_jstr(r, "chosen_reason")[0]) {
        ac_text_put(o, " (");
        esc(o, ac_jstr(r, "chosen_reason"));
        ac_text_put(o, ")");
    }
    ac_text_put(o, ".</p>\n");
    if (json_is_object(b) && json_is_true(obj(b, "feasible")) && ac_jnum(b, "perplexity") < ac_jnum(a, "perplexity"))
        ac_text_put(
            o,
            "<p class=\"note\">The %s arm also met every limit and had the lower held-out perplexity (%.4f against "
            "%.4f).</p>\n",
            other, ac_jnum(b, "perplexity"), ac_jnum(a, "perplexity"));
    for (int i = 1; i < NARMS; i++) {
        const json_t *x = obj(r, ARMS[i]);
        if (json_is_object(x) && !json_is_true(obj(x, "feasible")))
            ac_text_put(
                o,
                "<p class=\"note\">The %s arm missed at least one limit: its quality is shown below but it is not a "
                "candidate for export.</p>\n",
                ARMS[i]);
    }
    if (json_is_object(obj(r, "puzzle")))
        ac_text_put(o, "<p class=\"note\">The puzzle arm (Puzzle's block library scored by block-local "
                       "distillation, one block per layer chosen by a mixed-integer program) is reported for "
                       "comparison; it is not exported.</p>\n");
}

/* Every limit any arm reports, with each arm's predicted figure, met or missed. */
static void put_limits(ac_text *o, const json_t *r, const int *idx, int n) {
    const json_t *first = NULL;
    for (int i = 0; i < n && !first; i++)
        if (json_is_object(obj(obj(r, ARMS[idx[i]]), "constraints"))) first = obj(obj(r, ARMS[idx[i]]), "constraints");
    ac_text_put(o, "<h2>Limits</h2>\n");
    if (!first || !json_object_size(first)) {
        ac_text_put(o, "<p class=\"muted\">The job set no limit.</p>\n");
        return;
    }
    ac_text_put(o,
                "<p class=\"muted\">Each arm's figure as the cost model predicts it for the target; the base model's "
                "verdict is computed from its predicted figure.</p>\n<table id=\"limits\">\n");
    put_head_row(o, r, "limit", idx, n);
    const char *k;
    const json_t *c;
    json_object_foreach((json_t *)first, k, c) {
        int min = !strcmp(ac_jstr(c, "kind"), "min");
        ac_text_put(o, "<tr><th>");
        esc(o, k);
        ac_text_put(o, " %s %.*g</th>", min ? "&ge;" : "&le;", strcmp(k, "params") ? 6 : 12, ac_jnum(c, "limit"));
        for (int i = 0; i < n; i++) {
            const json_t *arm = obj(r, ARMS[idx[i]]), *ac = obj(obj(arm, "constraints"), k);
            double v;
            int met;
            if (json_is_object(ac)) {
                v = ac_jnum(ac, "value");
                met = json_is_true(obj(ac, "met"));
            } else if (has(obj(arm, "predicted"), k)) {
                v = ac_jnum(obj(arm, "predicted"), k);
                met = min ? v >= ac_jnum(c, "limit") : v <= ac_jnum(c, "limit");
            } else {
                ac_text_put(o, "<td>&mdash;</td>");
                continue;
            }
            ac_text_put(o, "<td class=\"n %s\">%.*g %s</td>", met ? "met" : "missed", strcmp(k, "params") ? 6 : 12, v,
                        met ? "met" : "missed");
        }
        ac_text_put(o, "</tr>\n");
    }
    ac_text_put(o, "<tr><th>all limits met</th>");
    for (int i = 0; i < n; i++) {
        const json_t *f = obj(obj(r, ARMS[idx[i]]), "feasible");
        if (!json_is_boolean(f))
            ac_text_put(o, "<td>&mdash;</td>");
        else
            ac_text_put(o, "<td class=\"%s\">%s</td>", json_is_true(f) ? "met" : "missed",
                        json_is_true(f) ? "yes" : "no");
    }
    ac_text_put(o, "</tr>\n</table>\n");
}

/* eval.tasks: a row per task (the base's names), a column per arm: acc +- its
 * standard error, acc_norm, and the figures before distillation. */
static void put_tasks(ac_text *o, const json_t *r, const int *idx, int n) {
    const json_t *names = obj(obj(r, "baseline"), "tasks");
    if (!json_object_size(names)) {
        ac_text_put(o, "<p class=\"muted\">Task accuracy: not measured by this job (no eval.tasks).</p>\n");
        return;
    }
    ac_text_put(o, "<p>Multiple-choice accuracy, zero-shot, scored as lm-evaluation-harness scores it: acc &plusmn; its "
                   "standard error, acc_norm, and both before distillation where it ran.</p>\n<table id=\"tasks\">\n");
    put_head_row(o, r, "task", idx, n);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)names, k, v) {
        ac_text_put(o, "<tr><th>");
        esc(o, k);
        ac_text_put(o, " (n = %.0f)</th>", ac_jnum(v, "n"));
        for (int i = 0; i < n; i++) {
            const json_t *a = obj(r, ARMS[idx[i]]), *t = obj(obj(a, "tasks"), k), *tp = obj(obj(a, "tasks_pruned"), k);
            if (!json_is_object(t)) {
                ac_text_put(o, "<td>&mdash;</td>");
                continue;
            }
            ac_text_put(o, "<td class=\"n\">%.4f &plusmn; %.4f, acc_norm %.4f", ac_jnum(t, "acc"), ac_jnum(t, "stderr"),
                        ac_jnum(t, "acc_norm"));
            if (json_is_object(tp))
                ac_text_put(o, " (before distillation %.4f, acc_norm %.4f)", ac_jnum(tp, "acc"), ac_jnum(tp, "acc_norm"));
            ac_text_put(o, "</td>");
        }
        ac_text_put(o, "</tr>\n");
    }
    ac_text_put(o, "</table>\n");
}

static void put_quality(ac_text *o, const json_t *r, const int *idx, int n) {
    const json_t *ev = obj(r, "eval_protocol");
    ac_text_put(o, "<h2>Quality before and after</h2>\n<p class=\"muted\">Held-out perplexity on %.0f tokens of <code>",
                ac_jnum(ev, "scored_tokens"));
    esc(o, ac_jstr(ev, "text"));
    ac_text_put(o,
                "</code> (windows of %.0f tokens, %s engine). An arm that missed a limit is marked: its perplexity is "
                "no win.</p>\n<table id=\"quality\">\n",
                ac_jnum(ev, "ctx"), ac_jstr(ev, "engine"));
    put_head_row(o, r, "", idx, n);
    ac_text_put(o, "<tr><th>perplexity</th>");
    for (int i = 0; i < n; i++) {
        const json_t *arm = obj(r, ARMS[idx[i]]), *f = obj(arm, "feasible");
        if (!has(arm, "perplexity")) {
            ac_text_put(o, "<td>&mdash;</td>");
            continue;
        }
        ac_text_put(o, "<td class=\"n%s\">%.4f%s</td>", json_is_false(f) ? " missed" : "", ac_jnum(arm, "perplexity"),
                    json_is_false(f) ? " (missed a limit)" : "");
    }
    ac_text_put(o, "</tr>\n<tr><th>perplexity before distillation</th>");
    for (int i = 0; i < n; i++) cell_num(o, obj(obj(r, ARMS[idx[i]]), "perplexity_pruned"), NULL);
    ac_text_put(o, "</tr>\n<tr><th>parameters</th>");
    for (int i = 0; i < n; i++) cell_num(o, obj(obj(obj(r, ARMS[idx[i]]), "predicted"), "params"), "params");
    ac_text_put(o, "</tr>\n<tr><th>distillation loss (first &rarr; last 5%% of steps)</th>");
    for (int i = 0; i < n; i++) {
        const json_t *d = obj(obj(r, ARMS[idx[i]]), "distill");
        if (json_is_object(d))
            ac_text_put(o, "<td class=\"n\">%.4f &rarr; %.4f (%.0f tokens)</td>", ac_jnum(d, "loss_first"),
                        ac_jnum(d, "loss_last"), ac_jnum(d, "tokens"));
        else
            ac_text_put(o, "<td>&mdash;</td>");
    }
    ac_text_put(o, "</tr>\n</table>\n");
    put_tasks(o, r, idx, n);
}

/* Predicted figures for the target, then what was measured against the cost table's prediction. */
static void put_cost(ac_text *o, const json_t *r, const int *idx, int n) {
    const json_t *tg = obj(r, "target"), *w = obj(tg, "workload");
    ac_text_put(o, "<h2>Cost: predicted and measured</h2>\n<p>Target: ");
    esc(o, ac_jstr(tg, "device_name"));
    ac_text_put(o, " (<code>");
    esc(o, ac_jstr(tg, "device"));
    ac_text_put(o, "</code>, cost model ");
    esc(o, ac_jstr(tg, "cost_source"));
    ac_text_put(o, ", engine ");
    esc(o, ac_jstr(obj(tg, "engine"), "name"));
    ac_text_put(o, "); workload batch %.0f, prompt %.0f, %.0f generated tokens.</p>\n", ac_jnum(w, "batch"),
                ac_jnum(w, "prompt_len"), ac_jnum(w, "gen_len"));
    static const char *const FIG[] = {"ttft_ms",     "tpot_ms",      "e2e_ms", "tokens_per_s", "memory_gib",
                                      "weights_gib", "kv_cache_gib", "params", "max_batch"};
    ac_text_put(o, "<table id=\"predicted\">\n");
    put_head_row(o, r, "predicted for the target", idx, n);
    for (size_t f = 0; f < sizeof FIG / sizeof *FIG; f++) {
        ac_text_put(o, "<tr><th>%s</th>", FIG[f]);
        for (int i = 0; i < n; i++) cell_num(o, obj(obj(obj(r, ARMS[idx[i]]), "predicted"), FIG[f]), FIG[f]);
        ac_text_put(o, "</tr>\n");
    }
    ac_text_put(o, "</table>\n");
    const json_t *m = obj(r, "measured_local");
    if (json_is_object(m)) {
        const json_t *p = obj(m, "predicted"), *mw = obj(m, "workload");
        const char *chosen = ac_jstr(r, "chosen"),
                   *other = !strcmp(chosen, "autocompress") ? "minitron" : "autocompress";
        ac_text_put(
            o,
            "<p>Measured on the job's CPU (AutoCompress's CPU engine, weights %s, batch %.0f, prompt %.0f, %.0f "
            "generated tokens) against the CPU cost table's prediction:</p>\n<table id=\"measured\">\n"
            "<tr><th>model</th><th>TTFT ms predicted</th><th>TTFT ms measured</th><th>error</th>"
            "<th>TPOT ms predicted</th><th>TPOT ms measured</th><th>error</th></tr>\n",
            ac_jstr(m, "weights_dtype"), ac_jnum(mw, "batch"), ac_jnum(mw, "prompt_len"), ac_jnum(mw, "gen_len"));
        const struct {
            const char *label, *meas, *pred;
        } rows[] = {{"baseline", "baseline", "baseline"}, {chosen, chosen, chosen}, {other, other, NULL}};
        for (int i = 0; i < 3; i++) {
            const json_t *mm = obj(m, rows[i].meas), *pp = rows[i].pred ? obj(p, rows[i].pred) : NULL;
            if (!json_is_object(mm)) continue;
            ac_text_put(o, "<tr><th>%s</th>", rows[i].label);
            const char *ks[] = {"ttft_ms", "tpot_ms"};
            for (int k = 0; k < 2; k++) {
                cell_num(o, obj(pp, ks[k]), NULL);
                cell_num(o, obj(mm, ks[k]), NULL);
                if (has(pp, ks[k]) && ac_jnum(pp, ks[k]) > 0)
                    ac_text_put(o, "<td class=\"n\">%+.1f%%</td>", 100 * (ac_jnum(pp, ks[k]) / ac_jnum(mm, ks[k]) - 1));
                else
                    ac_text_put(o, "<td>&mdash;</td>");
            }
            ac_text_put(o, "</tr>\n");
        }
        ac_text_put(o, "</table>\n<p class=\"muted\">error: predicted over measured, minus one.</p>\n");
    }
    const json_t *g = obj(r, "measured_on_target");
    if (json_is_object(g)) {
        ac_text_put(o, "<p>Measured on the target (");
        esc(o, ac_jstr(g, "device"));
        ac_text_put(o,
                    ", the exported arm): TTFT %.4g ms and TPOT %.4g ms measured, %.4g ms and %.4g ms predicted.</p>\n",
                    ac_jnum(obj(g, ac_jstr(r, "chosen")), "ttft_ms"), ac_jnum(obj(g, ac_jstr(r, "chosen")), "tpot_ms"),
                    ac_jnum(obj(obj(g, "predicted"), ac_jstr(r, "chosen")), "ttft_ms"),
                    ac_jnum(obj(obj(g, "predicted"), ac_jstr(r, "chosen")), "tpot_ms"));
    } else if (!json_is_object(m))
        ac_text_put(o, "<p class=\"muted\">Nothing was measured: the target is a spec profile.</p>\n");
}

/* The layer's figure k or -1. */
static double layer_fig(const json_t *arch, size_t l, const char *k) {
    const json_t *v = obj(json_array_get(obj(arch, "layers"), l), k);
    return json_is_number(v) ? json_number_value(v) : -1;
}

/* One SVG per axis: per layer, a bar per arm, its height the figure over the base's largest. */
static void put_structure(ac_text *o, const json_t *r, const int *idx, int n) {
    const json_t *base = obj(obj(r, "model"), "architecture");
    size_t L = json_array_size(obj(base, "layers"));
    ac_text_put(o, "<h2>Structure per layer</h2>\n<p>Hidden size %.0f before;", ac_jnum(base, "hidden"));
    for (int i = 1; i < n; i++) {
        const json_t *a = obj(obj(r, ARMS[idx[i]]), "architecture");
        ac_text_put(o, " %s %.0f (%zu layers)%s", ARMS[idx[i]], ac_jnum(a, "hidden"), json_array_size(obj(a, "layers")),
                    i + 1 < n ? ";" : ".");
    }
    ac_text_put(o, " Bars:");
    for (int i = 0; i < n; i++) ac_text_put(o, "<span class=\"key lk%d\"></span>%s", idx[i], ARMS[idx[i]]);
    ac_text_put(o, "</p>\n");
    /* a mixture-of-experts model: the experts kept and their width per layer, and the top-k each arm routes to */
    int moe = json_is_number(obj(base, "top_k")), nax = moe ? 5 : 3;
    if (moe) {
        ac_text_put(o, "<p id=\"top-k\">Experts per token (top-k): %.0f before;", ac_jnum(base, "top_k"));
        for (int i = 1; i < n; i++)
            ac_text_put(o, " %s %.0f%s", ARMS[idx[i]], ac_jnum(obj(obj(r, ARMS[idx[i]]), "architecture"), "top_k"),
                        i + 1 < n ? ";" : ".");
        const json_t *ch = obj(obj(r, "search"), "top_k_choices");
        if (json_array_size(ch)) { /* topk.c: the search ran once per k */
            ac_text_put(o, " The autocompress search tried");
            for (size_t c = 0; c < json_array_size(ch); c++) {
                const json_t *x = json_array_get(ch, c);
                ac_text_put(o, "%s k=%.0f (predicted loss increase %.4g, %s)", c ? "," : "", ac_jnum(x, "top_k"),
                            ac_jnum(x, "score"), json_is_true(obj(x, "feasible")) ? "feasible" : "infeasible");
            }
            ac_text_put(o, ".");
        }
        ac_text_put(o, "</p>\n");
    }
    static const char *const AX[] = {"heads", "kv_heads", "ffn", "experts", "expert_ffn"};
    static const char *const AXN[] = {"query heads", "KV heads", "FFN width", "experts", "expert FFN width"};
    const double W = 1040, H = 150, left = 40, bottom = 18;
    for (int x = 0; x < nax && L; x++) {
        double mx = 0;
        for (size_t l = 0; l < L; l++) /* the tallest bar of any arm (an export grid may pad past the base) */
            for (int i = 0; i < n; i++)
                mx = fmax(mx, layer_fig(i ? obj(obj(r, ARMS[idx[i]]), "architecture") : base, l, AX[x]));
        if (!(mx > 0)) continue;
        double gw = (W - left) / (double)L, bw = gw * 0.8 / n;
        ac_text_put(
            o,
            "<figure><figcaption>%s per layer (scale 0 to %.0f)</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" "
            "width=\"%.0f\" height=\"%.0f\" role=\"img\">",
            AXN[x], mx, W, H);
        for (size_t l = 0; l < L; l++) {
            for (int i = 0; i < n; i++) {
                const json_t *a = i ? obj(obj(r, ARMS[idx[i]]), "architecture") : base;
                double v = layer_fig(a, l, AX[x]);
                if (v < 0) v = 0;
                double h = (H - bottom - 4) * v / mx;
                ac_text_put(
                    o,
                    "<rect class=\"k%d\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"><title>layer %zu %s: "
                    "%.0f</title></rect>",
                    idx[i], left + l * gw + i * bw, H - bottom - h, bw, h, l, ARMS[idx[i]], v);
            }
            if (L <= 64 || l % 4 == 0)
                ac_text_put(o, "<text x=\"%.1f\" y=\"%.0f\" font-size=\"10\">L%zu</text>", left + l * gw, H - 4, l);
        }
        ac_text_put(o, "<text x=\"0\" y=\"12\" font-size=\"10\">%.0f</text></svg></figure>\n", mx);
    }
    ac_text_put(o, "<table id=\"structure\"><tr><th>layer</th>");
    for (int x = 0; x < nax; x++) ac_text_put(o, "<th>%s</th>", AXN[x]);
    ac_text_put(o, "</tr>\n");
    for (size_t l = 0; l < L; l++) {
        ac_text_put(o, "<tr><th>%zu</th>", l);
        for (int x = 0; x < nax; x++) {
            double b = layer_fig(base, l, AX[x]);
            if (x >= 3 && b < 0) { /* a dense layer of an MoE model has no experts */
                ac_text_put(o, "<td class=\"n\">&mdash;</td>");
                continue;
            }
            ac_text_put(o, "<td class=\"n\">%.0f", b);
            for (int i = 1; i < n; i++) {
                double v = layer_fig(obj(obj(r, ARMS[idx[i]]), "architecture"), l, AX[x]);
                ac_text_put(o, " &rarr; ");
                if (v < 0 && x >= 3 && l < json_array_size(obj(obj(obj(r, ARMS[idx[i]]), "architecture"), "layers")))
                    ac_text_put(o, "0"); /* the layer's experts were all removed */
                else if (v < 0)
                    ac_text_put(o, "(dropped)");
                else
                    ac_text_put(o, "%.0f", v);
                ac_text_put(o, "<sub>%c</sub>", ARMS[idx[i]][0]);
            }
            ac_text_put(o, "</td>");
        }
        ac_text_put(o, "</tr>\n");
    }
    ac_text_put(o, "</table>\n<p class=\"muted\">baseline &rarr; arm<sub>m</sub> (minitron) &rarr; arm<sub>a</sub> "
                   "(autocompress)%s; 0: the sub-block was removed.</p>\n",
                json_is_object(obj(r, "puzzle")) ? " &rarr; arm<sub>p</sub> (puzzle)" : "");
}

/* A polyline of [[x, y], ...] (at most 400 points drawn). */
static void put_curve(ac_text *o, const json_t *pts, const char *caption, const char *cls) {
    size_t n = json_array_size(pts);
    if (n < 2) return;
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        double x = json_number_value(json_array_get(json_array_get(pts, i), 0)),
               y = json_number_value(json_array_get(json_array_get(pts, i), 1));
        x0 = fmin(x0, x), x1 = fmax(x1, x), y0 = fmin(y0, y), y1 = fmax(y1, y);
    }
    if (!(x1 > x0)) x1 = x0 + 1;
    if (!(y1 > y0)) y1 = y0 + 1;
    const double W = 500, H = 200, l = 46, b = 20;
    ac_text_put(o, "<figure><figcaption>");
    esc(o, caption);
    ac_text_put(o,
                "</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" role=\"img\">"
                "<rect x=\"%.0f\" y=\"4\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#9ca3af\"/>"
                "<polyline class=\"%s\" fill=\"none\" stroke-width=\"1.5\" style=\"stroke:currentColor\" points=\"",
                W, H, l, W - l - 4, H - b - 4, cls);
    size_t step = n > 400 ? (n + 399) / 400 : 1;
    for (size_t i = 0; i < n; i += step) {
        double x = json_number_value(json_array_get(json_array_get(pts, i), 0)),
               y = json_number_value(json_array_get(json_array_get(pts, i), 1));
        ac_text_put(o, "%.1f,%.1f ", l + (W - l - 4) * (x - x0) / (x1 - x0),
                    4 + (H - b - 4) * (1 - (y - y0) / (y1 - y0)));
    }
    ac_text_put(
        o,
        "\"/><text x=\"0\" y=\"14\" font-size=\"10\">%.4g</text><text x=\"0\" y=\"%.0f\" font-size=\"10\">%.4g</text>"
        "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\">step %.0f</text><text x=\"%.0f\" y=\"%.0f\" "
        "font-size=\"10\">step %.0f</text></svg></figure>\n",
        y1, H - b, y0, l, H - 5, x0, W - 70, H - 5, x1);
}

static void put_curves(ac_text *o, const json_t *curves) {
    ac_text_put(o, "<h2>Loss curves</h2>\n");
    if (!json_is_object(curves)) {
        ac_text_put(o, "<p class=\"muted\">Not drawn here: report.json holds no per-step loss. The job's own "
                       "report.html and the daemon's copy (GET /v1/jobs/ID/report.html) draw the search and "
                       "distillation losses from the job's events.</p>\n");
        return;
    }
    const json_t *s = obj(curves, "search"), *d = obj(curves, "distill");
    int drawn = 0;
    if (json_array_size(s) > 1) {
        put_curve(o, s, ac_jstr(curves, "search_label")[0] ? ac_jstr(curves, "search_label") : "search loss", "s");
        drawn = 1;
    }
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)d, k, v) {
        char cap[128];
        snprintf(cap, sizeof cap, "distillation loss, %s arm", k);
        put_curve(o, v, cap, "d");
        drawn = 1;
    }
    if (!drawn) ac_text_put(o, "<p class=\"muted\">The job's events hold no loss curve.</p>\n");
}

json_t *ac_report_curves_new(void) {
    return json_pack("{s:[],s:s,s:{}}", "search", "search_label", "search loss", "distill");
}

void ac_report_curves_add(json_t *curves, const char *kind, const json_t *d) {
    if (!json_is_object(curves) || !kind) return;
    const char *ph = json_string_value(obj(d, "phase")), *arm = json_string_value(obj(d, "arm"));
    json_t *step = json_object_get(d, "step"), *v;
    if (!json_is_number(step)) return;
    if (!strcmp(kind, "search") && ph && (!strcmp(ph, "dnas") || !strcmp(ph, "autocompress"))) {
        int dnas = !strcmp(ph, "dnas");
        if (!json_is_number(v = json_object_get(d, dnas ? "task_loss" : "loss"))) return;
        json_object_set_new(curves, "search_label",
                            json_string(dnas ? "search: distillation KL of the gated model" : "search: Lagrangian"));
        json_array_append_new(json_object_get(curves, "search"), json_pack("[O,O]", step, v));
    } else if (!strcmp(kind, "distill") && arm && json_is_number(v = json_object_get(d, "loss"))) {
        json_t *dist = json_object_get(curves, "distill"), *a = json_object_get(dist, arm);
        if (!a) json_object_set_new(dist, arm, a = json_array());
        json_array_append_new(a, json_pack("[O,O]", step, v));
    }
}

char *ac_report_html(const json_t *r, const json_t *curves) {
    ac_text o = {.oom = 0};
    const json_t *model = obj(r, "model"), *tg = obj(r, "target");
    int idx[NARMS], n = arms_present(r, idx);
    ac_text_put(&o, "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>AutoCompress report: ");
    esc(&o, ac_jstr(model, "path"));
    ac_text_put(
        &o, "</title><style>%s .s{color:#2563eb}.d{color:#9333ea}</style></head><body>\n<h1>AutoCompress report</h1>\n",
        CSS);
    ac_text_put(&o, "<p><code>");
    esc(&o, ac_jstr(model, "path"));
    ac_text_put(&o, "</code> pruned for ");
    esc(&o, ac_jstr(tg, "device_name"));
    ac_text_put(&o, ", method <code>");
    esc(&o, ac_jstr(r, "method"));
    ac_text_put(&o, "</code>; report format ");
    esc(&o, ac_jstr(r, "version"));
    ac_text_put(&o, ".</p>\n");
    put_choice(&o, r);
    put_limits(&o, r, idx, n);
    put_quality(&o, r, idx, n);
    put_cost(&o, r, idx, n);
    put_structure(&o, r, idx, n);
    put_curves(&o, curves);
    const json_t *ex = obj(r, "export"), *t = obj(r, "timings_s");
    ac_text_put(&o, "<h2>Export and timings</h2>\n<p>Exported to <code>");
    esc(&o, ac_jstr(ex, "dir"));
    ac_text_put(&o, "</code> (");
    esc(&o, ac_jstr(ex, "format"));
    ac_text_put(&o, ", ");
    esc(&o, ac_jstr(ex, "dtype"));
    ac_text_put(&o, ").</p>\n<p class=\"muted\">Stage seconds:");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)t, k, v) {
        ac_text_put(&o, " ");
        esc(&o, k);
        ac_text_put(&o, " %.1f", json_number_value(v));
    }
    ac_text_put(&o, ". Every figure here is in report.json beside this file.</p>\n</body></html>\n");
    return ac_text_take(&o);
}

int ac_report_html_write(const json_t *report, const json_t *curves, const char *dir, ac_err *e) {
    return ac_text_write(ac_report_html(report, curves), dir, "report.html", e);
}
