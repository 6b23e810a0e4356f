// Runs a wasm32-wasip1 binary (a test harness or an example) on Node's V8, the engine Envoy embeds.
// The scanner's SIMD path only exists on wasm, so its unit tests must also run there:
//   CARGO_TARGET_WASM32_WASIP1_RUNNER="node --no-warnings --no-liftoff filters/core/examples/wasi_run.mjs" \
//     cargo test --release --target wasm32-wasip1 -p llmkube-router-core
import { readFile } from "node:fs/promises";
import { WASI } from "node:wasi";
import { argv, env, exit } from "node:process";

const wasi = new WASI({
  version: "preview1",
  args: argv.slice(2),
  env,
  preopens: { "/": "/" },
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(argv[2]));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
exit(wasi.start(instance));
