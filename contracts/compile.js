#!/usr/bin/env node
// Compile contracts/src/*.sol with the pinned solcjs (standard JSON) and write
// contracts/artifacts/<Contract>.json (abi + bytecode). `--check` recompiles and exits 1 if the
// committed artifacts differ from the sources, so stale artifacts fail CI.
"use strict";
const fs = require("fs");
const path = require("path");
const solc = require("solc");

const ROOT = path.resolve(__dirname, "..");
const SRC = path.join(__dirname, "src");
const OUT = path.join(__dirname, "artifacts");
// Deployment order: each contract only needs addresses of the ones before it.
const DEPLOY_ORDER = ["IntellectToken", "ComputeRegistry", "DomainRegistry", "ComputePool"];

function findImport(importPath) {
  for (const base of [path.join(ROOT, "node_modules"), __dirname]) {
    const file = path.join(base, importPath);
    if (fs.existsSync(file)) return { contents: fs.readFileSync(file, "utf8") };
  }
  return { error: `import not found: ${importPath}` };
}

function compile() {
  const sources = {};
  for (const name of fs.readdirSync(SRC).filter((f) => f.endsWith(".sol")).sort()) {
    sources[`src/${name}`] = { content: fs.readFileSync(path.join(SRC, name), "utf8") };
  }
  const input = {
    language: "Solidity",
    sources,
    settings: {
      optimizer: { enabled: true, runs: 200 },
      evmVersion: "cancun",
      outputSelection: { "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"] } },
    },
  };
  const output = JSON.parse(solc.compile(JSON.stringify(input), { import: findImport }));
  const errors = (output.errors || []).filter((e) => e.severity === "error");
  // Show our own warnings; OpenZeppelin's are not ours to fix.
  for (const e of output.errors || []) {
    const file = (e.sourceLocation && e.sourceLocation.file) || "";
    if (e.severity === "error" || file.startsWith("src/")) console.error(e.formattedMessage);
  }
  if (errors.length) process.exit(2);
  const artifacts = {};
  for (const [file, contracts] of Object.entries(output.contracts)) {
    if (!file.startsWith("src/")) continue;
    for (const [name, c] of Object.entries(contracts)) {
      artifacts[`${name}.json`] = {
        contractName: name,
        sourceName: file,
        compiler: solc.version(),
        abi: c.abi,
        bytecode: "0x" + c.evm.bytecode.object,
        deployedBytecode: "0x" + c.evm.deployedBytecode.object,
      };
    }
  }
  artifacts["manifest.json"] = { compiler: solc.version(), deployOrder: DEPLOY_ORDER };
  const text = {};
  for (const [file, data] of Object.entries(artifacts)) text[file] = JSON.stringify(data, null, 2) + "\n";
  return text;
}

function main() {
  const check = process.argv.includes("--check");
  const text = compile();
  if (check) {
    const stale = [];
    for (const [file, content] of Object.entries(text)) {
      const p = path.join(OUT, file);
      if (!fs.existsSync(p) || fs.readFileSync(p, "utf8") !== content) stale.push(file);
    }
    const extra = fs.existsSync(OUT) ? fs.readdirSync(OUT).filter((f) => !(f in text)) : [];
    if (stale.length || extra.length) {
      console.error(`artifacts out of date: ${[...stale, ...extra].join(", ")}; run \`make compile\``);
      process.exit(1);
    }
    console.log(`artifacts match sources (${Object.keys(text).length} files)`);
    return;
  }
  fs.mkdirSync(OUT, { recursive: true });
  for (const [file, content] of Object.entries(text)) fs.writeFileSync(path.join(OUT, file), content);
  for (const name of DEPLOY_ORDER) {
    const size = (JSON.parse(text[`${name}.json`]).deployedBytecode.length - 2) / 2;
    console.log(`${name}: ${size} bytes deployed`);
  }
}

main();
