// Compiles every schema of package schema in Ajv's strict mode, which
// rejects unknown keywords, ignored keywords and ambiguous types, and
// validates the examples named on the command line: each argument is
// <schema URL>=<file> or !<schema URL>=<file> for a document that must fail.
// Run by schema's TestAjvStrict.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const dir = join(dirname(fileURLToPath(import.meta.url)), "..");
const files = ["acl.schema.json", "protocol.schema.json", "registry.schema.json", "alert.schema.json"];

const ajv = new Ajv2020({ strict: true, allErrors: true });
addFormats(ajv);
for (const f of files) {
  ajv.addSchema(JSON.parse(readFileSync(join(dir, f), "utf8")));
}
let failed = false;
// Compile each document and each of its definitions: Ajv compiles, and
// so checks, only what a compiled schema reaches.
for (const f of files) {
  const doc = JSON.parse(readFileSync(join(dir, f), "utf8"));
  for (const url of [doc.$id, ...Object.keys(doc.$defs ?? {}).map((d) => `${doc.$id}#/$defs/${d}`)]) {
    try {
      if (!ajv.getSchema(url)) throw new Error("not found");
    } catch (e) {
      console.error(`${f}: ${url}: ${e.message}`);
      failed = true;
    }
  }
}
for (const arg of process.argv.slice(2)) {
  const mustFail = arg.startsWith("!");
  const [url, file] = (mustFail ? arg.slice(1) : arg).split("=");
  const validate = ajv.getSchema(url);
  if (!validate) {
    console.error(`${url}: no such schema`);
    failed = true;
    continue;
  }
  const ok = validate(JSON.parse(readFileSync(file, "utf8")));
  if (ok === mustFail) {
    console.error(`${file} against ${url}: valid ${ok}, want ${!mustFail}: ${JSON.stringify(validate.errors)}`);
    failed = true;
  }
}
process.exit(failed ? 1 : 0);
