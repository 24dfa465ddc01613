// Prefill speed of llama.cpp (node-llama-cpp's prebuilt CPU binaries) for
// bench/bench_prefill.py. Usage: node prefill_llama.mjs MODEL.gguf PROMPT_LEN REPS THREADS
// Evaluates REPS prompts of PROMPT_LEN token ids (one batch each, the KV cache
// cleared between them) and prints one JSON line: tokens, seconds (all reps,
// the first one included, as the engine's eval counts its first window),
// tok_per_s, and per-rep seconds.
// node-llama-cpp is installed under tests/llama (an ES module import resolves
// from this file's folder, so it is loaded by path).
import {fileURLToPath, pathToFileURL} from "node:url";
import {dirname, join} from "node:path";

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const pkg = join(root, "tests", "llama", "node_modules", "node-llama-cpp", "dist", "index.js");
const {getLlama, LlamaLogLevel} = await import(pathToFileURL(pkg).href);

const [modelPath, lenArg, repsArg, thrArg] = process.argv.slice(2);
const P = Number(lenArg), reps = Number(repsArg), threads = Number(thrArg);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false});
const model = await llama.loadModel({modelPath});
const context = await model.createContext({contextSize: P, batchSize: P, threads});
const seq = context.getSequence();
let state = 12345;
const ids = Array.from({length: P}, () => (state = (state * 1103515245 + 12345) % 2147483648) % 1000);
const per = [];
for (let r = 0; r < reps; r++) {
    await seq.clearHistory();
    const t0 = process.hrtime.bigint();
    await seq.evaluateWithoutGeneratingNewTokens(ids);
    per.push(Number(process.hrtime.bigint() - t0) / 1e9);
}
const seconds = per.reduce((a, b) => a + b, 0);
console.log(JSON.stringify({tokens: P * reps, seconds, tok_per_s: (P * reps) / seconds, per_rep: per}));
await context.dispose();
await model.dispose();
await llama.dispose();
