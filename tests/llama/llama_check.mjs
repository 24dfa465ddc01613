// Runs a GGUF file in llama.cpp (node-llama-cpp's prebuilt CPU binaries) for
// tests/test_gguf.c. Usage: node llama_check.mjs MODEL.gguf JOB.json
// JOB: {"windows": [[ids..], ..], "text": "...", "prompt": [ids..], "gen": N,
//       "texts": ["...", ..] (optional: tokenized each, as "texts_tokens"),
//       "through_eog": true (optional: generation goes on through end-of-generation
//       tokens, each fed back as the next input, so exactly N tokens)}
// Prints one JSON line: per window the summed next-token NLL (nats) and the
// count scored (every position but the last), llama.cpp's tokenization of
// "text", and N greedily generated tokens after "prompt" with their text.
import {readFileSync} from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, jobPath] = process.argv.slice(2);
const job = JSON.parse(readFileSync(jobPath, "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false});
const model = await llama.loadModel({modelPath});
const ctxLen = Math.max(...job.windows.map((w) => w.length), job.prompt.length + job.gen, 16);
const context = await model.createContext({contextSize: ctxLen, batchSize: ctxLen, threads: 2});
const seq = context.getSequence();
const out = {nll: [], count: [], tokens: Array.from(model.tokenize(job.text))};
out.texts_tokens = (job.texts ?? []).map((t) => Array.from(model.tokenize(t)));
for (const w of job.windows) {
    await seq.clearHistory();
    const res = await seq.controlledEvaluate(w.map((t, i) => (i + 1 < w.length ? [t, {generateNext: {logits: true}}] : t)));
    let nll = 0, count = 0;
    for (let i = 0; i + 1 < w.length; i++) {
        const logits = res[i].next.logits;
        let mx = -Infinity;
        for (const v of logits.values()) mx = Math.max(mx, v);
        let s = 0;
        for (const v of logits.values()) s += Math.exp(v - mx);
        nll -= logits.get(w[i + 1]) - mx - Math.log(s);
        count++;
    }
    out.nll.push(nll);
    out.count.push(count);
}
await seq.clearHistory();
const gen = [];
for await (const t of seq.evaluate(job.prompt, {temperature: 0, yieldEogToken: job.through_eog === true})) {
    gen.push(t);
    if (gen.length >= job.gen) break;
}
out.gen_tokens = gen;
out.generated = model.detokenize(gen);
console.log(JSON.stringify(out));
await context.dispose();
await model.dispose();
await llama.dispose();
