// Runs the wasm32-wasip1 build of examples/scan_speed.rs on Node's V8 (the engine Envoy embeds).
// node filters/core/examples/scan_speed_v8.mjs [BODY.json ...]   (paths inside the repo)
// node filters/core/examples/scan_speed_v8.mjs --scan-only BODY.json ...   (the whole-body scan only)
//
// Envoy's V8 (proxy-wasm-cpp-host) turns Liftoff off, so every function is TurboFan-compiled
// up front; do the same here, or the timing loop (never re-entered, so never tiered up) would
// run Liftoff code.
import { readFile } from "node:fs/promises";
import { WASI } from "node:wasi";
import { argv } from "node:process";
import path from "node:path";
import v8 from "node:v8";
import { fileURLToPath } from "node:url";

v8.setFlagsFromString("--no-liftoff");
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
// SCAN_SPEED_WASM: another build of the example (an A/B of two scanner versions).
const wasmPath =
  process.env.SCAN_SPEED_WASM ?? path.join(root, "target/wasm32-wasip1/release/examples/scan_speed.wasm");
const wasi = new WASI({
  version: "preview1",
  // Paths are seen from the repository root; options (`--scan-only`) pass as they are.
  args: [
    "scan_speed",
    ...argv
      .slice(2)
      .map((p) => (p.startsWith("--") ? p : "/root/" + path.relative(root, path.resolve(p)))),
  ],
  preopens: { "/root": root },
});
const module = await WebAssembly.compile(await readFile(wasmPath));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
wasi.start(instance);
