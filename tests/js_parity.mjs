// The JavaScript side of the call identity, for tests/test_hostile_input.py.
//
// Reads JSON Lines from stdin, one `{"tool": string, "args": value}` per line
// (written with ensure_ascii, so lone surrogates arrive as \ud800 escapes and
// survive), and writes one `{"canonical": string, "sha256": hex}` per line:
//
//   canonical = JSON.stringify with object keys sorted by JavaScript's
//               default sort (UTF-16 code units) at every level
//   sha256    = sha256 of UTF-8(tool + "\n" + canonical), Node's encoder
//               (a lone surrogate becomes U+FFFD)
//
// Everything is read first and written at once: one process per test run.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";

function canonical(value) {
  if (Array.isArray(value)) {
    return "[" + value.map((item) => canonical(item)).join(",") + "]";
  }
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value).sort();
    return "{" + keys.map((key) => JSON.stringify(key) + ":" + canonical(value[key])).join(",") + "}";
  }
  return JSON.stringify(value);
}

const lines = readFileSync(0, "utf8").split("\n").filter((line) => line.length > 0);
const out = [];
for (const line of lines) {
  const { tool, args } = JSON.parse(line);
  const text = canonical(args);
  const sha256 = createHash("sha256").update(tool + "\n" + text, "utf8").digest("hex");
  out.push(JSON.stringify({ canonical: text, sha256 }));
}
process.stdout.write(out.join("\n") + (out.length ? "\n" : ""));
