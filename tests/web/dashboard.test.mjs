// Dashboard end to end in Debian's headless Chromium (playwright-core):
// the page lists jobs, a job submitted through the form appears, and its
// live SSE events render (stages, search chart, per-layer bars, result).
import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

const root = process.env.AC_TEST_ROOT || path.resolve(path.dirname(new URL(import.meta.url).pathname), "../..");
const build = process.env.AC_BUILD || path.join(root, "build");
let passed = 0, failed = 0;

function freePort() {
  return new Promise((res) => { const s = net.createServer(); s.listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => res(p)); }); });
}

async function main() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "acweb_"));
  const port = await freePort();
  const d = spawn(path.join(build, "autocompressd"), ["--listen", `127.0.0.1:${port}`, "--db", path.join(dir, "db.sqlite"), "--data-dir", path.join(dir, "data"), "--web-dir", path.join(root, "web")], { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  d.stderr.on("data", (b) => { log += b; });
  for (let i = 0; i < 100; i++) {
    try { const r = await fetch(`http://127.0.0.1:${port}/healthz`); if (r.ok) break; } catch (e) { /* not yet */ }
    await new Promise((r) => setTimeout(r, 50));
  }
  const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"] });
  const page = await browser.newPage({ viewport: { width: 1200, height: 1400 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  const check = async (name, fn) => {
    try { await fn(); passed++; console.log("ok   " + name); } catch (e) { failed++; console.log("FAIL " + name + ": " + (e && e.stack || e)); }
  };
  try {
    await page.goto(`http://127.0.0.1:${port}/`);
    await check("dashboard_loads", async () => {
      await page.waitForSelector("#jobs");
      const h = await page.textContent("#health");
      if (!/^v\d/.test(h.trim()) && h !== "…") throw new Error("health: " + h);
      // the executor jobs go to, as GET /v1/config says (this daemon: the default, local)
      await page.waitForFunction(() => document.querySelector("#health").textContent.includes("executor local"));
    });
    await check("bad_spec_shows_error", async () => {
      await page.fill("#spec", '{"model": 5}');
      await page.click("#submit-btn");
      await page.waitForFunction(() => document.querySelector("#submit-msg").textContent.includes("400"));
    });
    const spec = {
      name: "from-the-dashboard", model: path.join(build, "models/tiny"), calibration: path.join(build, "data/calib.txt"),
      heldout: path.join(build, "data/heldout.txt"), target: { device: "H100", workload: { batch: 1, prompt_len: 512, gen_len: 64 } },
      constraints: { max_params: 1.0e6 }, search: { steps: 120, seed: 2, dnas_steps: 40 }, calibration_tokens: 2048,
      eval: { ctx: 64, windows: 4, tasks: [{ name: "mc", path: path.join(dir, "mc.jsonl") }] },
    };
    // dnas_steps 40: the suite's gate search length (tests/harness.py's spec), a few seconds of job, not the service's
    // 300 (half a minute, minutes beside the other lanes)
    // a two-question task (docs/tasks.md): the result table gets a row of each arm's accuracy
    fs.writeFileSync(path.join(dir, "mc.jsonl"), '{"context": "A penny saved is a penny", "choices": ["earned.", "lost."], "gold": 0}\n' +
      '{"context": "Look before you", "choices": ["leap.", "sleep."], "gold": 0}\n');
    let jobA = null;
    await check("submitted_job_appears_and_streams", async () => {
      await page.fill("#spec", JSON.stringify(spec));
      await page.click("#submit-btn");
      await page.waitForFunction(() => /^#job\/\d+$/.test(location.hash));
      jobA = +new URL(page.url()).hash.split("/")[1];
      await page.waitForFunction(() => document.querySelector("#events").textContent.includes("search:"), null, { timeout: 120000 });
      await page.waitForFunction(() => document.querySelector("#job-state").textContent === "succeeded", null, { timeout: 120000 });
      await page.waitForFunction(() => document.querySelectorAll("#summary tr").length >= 6, null, { timeout: 10000 });
      const taskRow = await page.$$eval("#summary tr", (rs) => rs.map((r) => r.textContent).find((t) => t.startsWith("task mc acc (n 2)")) || "");
      if ((taskRow.match(/±/g) || []).length !== 3) throw new Error("task row: " + taskRow);
      const bars = await page.$$eval("#arch .layer", (ls) => ls.length);
      if (bars !== 6) throw new Error("expected 6 layer bars, got " + bars);
      const stagesDone = await page.$$eval("#stages span.done", (s) => s.length);
      if (stagesDone !== 7) throw new Error("stages done: " + stagesDone);
      const inked = await page.$eval("#loss-chart", (c) => { const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data; let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; });
      if (inked < 500) throw new Error("loss chart is empty");
      // dnas (the default search.method): the architecture's evolution is drawn, one column per search event
      const hist = await page.$eval("#arch-history", (c) => { const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data; let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; });
      if (hist < 0.5 * 940 * 180) throw new Error("architecture history is empty: " + hist);
      await page.screenshot({ path: path.join(build, "dashboard.png"), fullPage: true });
    });
    await check("job_listed_with_state", async () => {
      await page.click("#back");
      await page.waitForFunction(() => [...document.querySelectorAll("#jobs tbody tr")].some((r) => r.textContent.includes("from-the-dashboard") && r.textContent.includes("succeeded")));
    });
    await check("comparison_view_shows_both_jobs", async () => {
      // a second job with a tighter limit, through the API; both ticked in the list (the first before one of the
      // list's 3-second refreshes, which must keep it ticked), then "Compare selected"
      const specB = Object.assign({}, spec, { name: "second-for-compare", constraints: { max_params: 0.8e6 }, search: { steps: 60, seed: 1, dnas_steps: 40 }, eval: { ctx: 64, windows: 4 } });
      const sub = await fetch(`http://127.0.0.1:${port}/v1/jobs`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(specB) });
      if (sub.status !== 201) throw new Error("submit: " + sub.status + " " + (await sub.text()));
      const jobB = (await sub.json()).id;
      const result = async (id) => (await fetch(`http://127.0.0.1:${port}/v1/jobs/${id}/result`)).json();
      for (let t = 0; ; t++) {
        const st = (await (await fetch(`http://127.0.0.1:${port}/v1/jobs/${jobB}`)).json()).state;
        if (st === "succeeded") break;
        if (st === "failed" || st === "cancelled" || t > 600) throw new Error(`job ${jobB}: ${st}`);
        await new Promise((r) => setTimeout(r, 500));
      }
      const res = { [jobA]: await result(jobA), [jobB]: await result(jobB) };
      await page.waitForSelector(`input.pick[value="${jobB}"]`);
      await page.check(`input.pick[value="${jobA}"]`);
      await page.waitForTimeout(3500); // one refresh of the list redraws its rows
      await page.check(`input.pick[value="${jobB}"]`);
      if (!(await page.isChecked(`input.pick[value="${jobA}"]`))) throw new Error("the first tick was lost in a refresh");
      await page.click("#compare-btn");
      await page.waitForFunction((h) => location.hash === h, `#compare/${jobA},${jobB}`);
      await page.waitForFunction(() => document.querySelectorAll("#compare tbody tr").length >= 8, null, { timeout: 20000 });
      const t = await page.$$eval("#compare tr", (rs) => rs.map((r) => [...r.children].map((c) => ({ text: c.textContent, cls: c.className }))));
      const [head1, head2, ...body] = t;
      const rows = Object.fromEntries(body.map((r) => [r[0].text, r.slice(1)]));
      // the columns: every arm of each job, in the order picked; the chosen arm of each job marked
      const cols = [];
      for (const id of [jobA, jobB]) for (const a of ["baseline", "minitron", "autocompress"]) if (res[id][a]) cols.push({ id, a, r: res[id] });
      const got = head1.slice(1).map((c, i) => [c.text.split(" ")[1], head2[i + 1].text.split(" ")[0]].join(" "));
      if (JSON.stringify(got) !== JSON.stringify(cols.map((c) => `${c.id} ${c.a}`))) throw new Error("columns: " + got);
      cols.forEach((c, i) => {
        const chosen = head2[i + 1].cls === "chosen";
        if (chosen !== (c.r.chosen === c.a) || chosen !== head2[i + 1].text.includes("(chosen, exported)")) throw new Error(`chosen mark, job ${c.id} ${c.a}`);
        // each job's own figures: perplexity, predicted parameters and TPOT, its limit met or missed
        const ppl = rows.perplexity[i].text, p = c.r[c.a].perplexity.toFixed(3);
        if (!ppl.startsWith(p)) throw new Error(`perplexity of job ${c.id} ${c.a}: ${ppl}, report ${p}`);
        if (rows["params (predicted)"][i].text !== c.r[c.a].predicted.params.toFixed(0)) throw new Error(`params of job ${c.id} ${c.a}`);
        if (rows["tpot_ms (predicted)"][i].text !== c.r[c.a].predicted.tpot_ms.toFixed(3)) throw new Error(`tpot of job ${c.id} ${c.a}`);
        const lim = c.r[c.r.chosen].constraints.params.limit, v = c.r[c.a].predicted.params;
        const met = c.a === "baseline" ? v <= lim : c.r[c.a].constraints.params.met;
        const cell = rows["limit params"][i];
        if (cell.text !== `${v.toFixed(0)} ≤ ${lim} ${met ? "met" : "missed"}` || cell.cls !== (met ? "met" : "missed")) throw new Error(`limit of job ${c.id} ${c.a}: ${cell.text}`);
        if (ppl.includes("(missed a limit)") === met) throw new Error(`perplexity verdict of job ${c.id} ${c.a}: ${ppl}`);
        // job A scored task mc, job B none
        const x = (c.r[c.a].tasks || {}).mc, tc = rows["task mc acc"][i].text;
        const want = x ? `${x.acc.toFixed(3)} ± ${x.stderr.toFixed(3)} (norm ${x.acc_norm.toFixed(3)}, n ${x.n})` : "not scored";
        if (tc !== want || !!x !== (c.id === jobA)) throw new Error(`task of job ${c.id} ${c.a}: ${tc}, want ${want}`);
      });
      // the best perplexity named is the lowest among the arms that met their job's limit
      const ok = cols.filter((c) => (c.a === "baseline" ? c.r.baseline.predicted.params <= c.r[c.r.chosen].constraints.params.limit : c.r[c.a].feasible));
      const best = Math.min(...ok.map((c) => c.r[c.a].perplexity));
      const note = await page.textContent("#compare-note");
      if (!note.includes(`met every limit of their job: ${best.toFixed(3)}`)) throw new Error("note: " + note);
      await page.screenshot({ path: path.join(build, "dashboard-compare.png"), fullPage: true });
    });
    await check("no_page_errors", async () => { if (errors.length) throw new Error(errors.join("\n")); });
  } finally {
    await browser.close();
    d.kill("SIGTERM");
    fs.rmSync(dir, { recursive: true, force: true });
  }
  console.log(`RESULT ${passed} ${failed} 0`);
  process.exit(failed ? 1 : 0);
}
main().catch((e) => { console.log("FAIL dashboard: " + e.stack); console.log(`RESULT ${passed} ${failed + 1} 0`); process.exit(1); });
